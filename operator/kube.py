"""A small dict-in, dict-out Kubernetes API client for the few calls the operator makes.

The official client does the authentication (kubeconfig or in-cluster); objects stay plain
dicts, as manifests.py builds them. Patches are JSON merge patches: a list is replaced whole
and a null removes a key, which is what "make the child look like this" means.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import threading
import time
import urllib.parse
from typing import Any

import kubernetes
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "InferenceService": "inferenceservices",
    "Pod": "pods",
    "Event": "events",
    # routing.inferencePool and autoscaling mode keda
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "InferencePool": "inferencepools",
    "HTTPRoute": "httproutes",
    "ScaledObject": "scaledobjects",
}
# How long an answer of API discovery is trusted: a CRD installed later (the inference
# extension's, KEDA's) is seen within this long, without asking on every pass.
DISCOVERY_SECONDS = 60
TIMEOUT_SECONDS = 30
# The name the API server records as the field manager of the operator's writes (it takes the
# User-Agent up to its first "/" when a request names no fieldManager) and that Events show in
# `kubectl describe` as their source.
MANAGER = "tokenmill-operator"


def _version() -> str:
    try:
        return importlib.metadata.version("tokenmill")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# One warning of a `Warning` header (RFC 7234 5.5, as apimachinery's ParseWarningHeader reads
# it): code, agent, quoted text with backslash escapes, an optional quoted date; several are
# comma-separated.
WARNING = re.compile(r'\s*(\d{3}) (\S+) "((?:[^"\\]|\\.)*)"(?: "[^"]*")?\s*(?:,|$)')


def load_config() -> None:
    """In-cluster credentials inside a pod, else the kubeconfig (KUBECONFIG or ~/.kube)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


def api_message(error: ApiException) -> str:
    """The API server's own explanation (its Status object's message), else the HTTP reason:
    "cannot set blockOwnerDeletion ..." says far more than "403 Forbidden"."""
    try:
        message = json.loads(error.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{error.status} {message or error.reason}"


def parse_warnings(headers: list[str]) -> list[str]:
    """The texts of the API server's warnings (`Warning: 299 - "unknown field ..."`): the
    server sends them on a write it accepted but changed, e.g. a field it does not know."""
    texts = []
    for header in headers:
        for match in WARNING.finditer(header):
            texts.append(re.sub(r"\\(.)", r"\1", match.group(3)))
    return texts


def parse_version(info: dict[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of GET /version; managed clusters write minors such as "28+"."""
    try:
        return int(info["major"]), int(re.sub(r"\D.*", "", str(info["minor"])))
    except (KeyError, ValueError, TypeError):
        return None


def path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}" + (f"/{name}" if name else "")


def object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


class Kube:
    """get/create/patch/delete of namespaced objects, as dicts."""

    def __init__(self, api: ApiClient | None = None):
        self.api = api or ApiClient()
        self.api.user_agent = self.user_agent()
        self._local = threading.local()  # the warnings of this thread's last call
        self._version: tuple[int, int] | None = None
        self._served: dict[str, tuple[float, frozenset[str]]] = {}  # discovery, by apiVersion

    @staticmethod
    def user_agent() -> str:
        return f"{MANAGER}/{_version()}"

    def _call(self, method: str, url: str, body: Any = None,
              content_type: str = "application/json") -> dict[str, Any]:
        params = self.api.param_serialize(
            method=method, resource_path=url, body=body, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json", "Content-Type": content_type},
        )
        response = self.api.call_api(*params, _request_timeout=TIMEOUT_SECONDS)
        response.read()
        self._local.warnings = parse_warnings(response.headers.getlist("Warning"))
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return json.loads(response.data or b"{}")

    def warnings(self) -> list[str]:
        """The API server's warnings on this thread's last call."""
        return list(getattr(self._local, "warnings", []))

    def server_version(self) -> tuple[int, int] | None:
        """(major, minor) of the API server, asked once; None while it cannot be read."""
        if self._version is None:
            try:
                self._version = parse_version(self._call("GET", "/version"))
            except (ApiException, OSError, ValueError):
                return None
        return self._version

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` in `api_version` (API discovery: GET
        /apis/GROUP/VERSION lists the resources of a group version it serves, 404 when none),
        asked again after DISCOVERY_SECONDS."""
        now = time.monotonic()
        cached = self._served.get(api_version)
        if cached is None or now - cached[0] > DISCOVERY_SECONDS:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                found = self._call("GET", prefix).get("resources") or []
            except ApiException as e:
                if e.status != 404:
                    raise
                found = []
            cached = (now, frozenset(r.get("name", "") for r in found))
            self._served[api_version] = cached
        return PLURALS[kind] in cached[1]

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self._call("GET", path(api_version, kind, namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str,
             labels: dict[str, str]) -> list[dict[str, Any]]:
        """Objects with every one of `labels` (checked here too, whatever the server filters)."""
        query = urllib.parse.urlencode(
            {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())})
        items = self._call("GET", f"{path(api_version, kind, namespace)}?{query}").get("items")
        return [item for item in items or []
                if labels.items() <= (item.get("metadata", {}).get("labels") or {}).items()]

    def events(self, namespace: str, kind: str, reason: str) -> list[dict[str, Any]]:
        """The namespace's core Events with this reason about objects of this kind (checked
        here too, whatever the server filters)."""
        query = urllib.parse.urlencode(
            {"fieldSelector": f"involvedObject.kind={kind},reason={reason}"})
        items = self._call("GET", f"{path('v1', 'Event', namespace)}?{query}").get("items")
        return [item for item in items or [] if item.get("reason") == reason
                and (item.get("involvedObject") or {}).get("kind") == kind]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self._call("POST", path(obj["apiVersion"], obj["kind"], meta["namespace"]), obj)

    def patch(self, obj: dict[str, Any], patch: dict[str, Any], subresource: str = "",
              manager: str = "") -> dict:
        """A merge patch; `manager` names the field manager when it is not the operator's
        (the built-in autoscaler owns spec.replicas under its own name)."""
        url = object_path(obj) + (f"/{subresource}" if subresource else "")
        if manager:
            url += "?" + urllib.parse.urlencode({"fieldManager": manager})
        return self._call("PATCH", url, patch, "application/merge-patch+json")

    def delete(self, obj: dict[str, Any]) -> None:
        try:
            self._call("DELETE", object_path(obj))
        except ApiException as e:
            if e.status != 404:
                raise
