"""Shared helpers of the operator tests: the CRD schema as the API server applies it (defaults,
OpenAPI validation, CEL rules), a running operator against kmock's Kubernetes emulator, and
HTTP servers standing in for engine pods."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import celpy
import jsonschema
import kmock
import yaml
from apiserver_model.versions import drop_unknown, warning_header
from apiserver_model.writes import (
    TOO_LONG,
    canonicalize,
    default_volumes,
    event_errors,
    merge_patch,
    omit_empty,
    too_long,
)
from process_support import free_port
from prometheus_client import generate_latest

from tokenmill.engine.contract.config import (
    EngineConfig,
    add_engine_arguments,
    engine_config_from_args,
)
from tokenmill.engine.server.metrics import EngineMetrics
from tokenmill.operator import manifests
from tokenmill.operator.reconcile import load

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "inferenceservices.tokenmill.io.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
IS_PATH = "/apis/tokenmill.io/v1alpha1/namespaces/{ns}/inferenceservices"


def crd_schema() -> dict[str, Any]:
    """The checked-in CRD's schema, a copy of its own for each caller."""
    return copy.deepcopy(_checked_in_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@functools.cache
def _checked_in_crd() -> dict[str, Any]:
    """The CRD file, parsed once per process (by libyaml where PyYAML has it: the pure-Python
    parser takes half a second over it)."""
    return yaml.load(CRD_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting, as the API server does before validation."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and "items" in schema:
            return [with_defaults(schema["items"], v) for v in value]
        return value
    out = copy.deepcopy(value)
    for name, sub in schema.get("properties", {}).items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = with_defaults(sub, out[name])
    return out


def cel_errors(schema: dict[str, Any], value: Any, env: celpy.Environment | None = None) -> list:
    """Messages of every x-kubernetes-validations rule that `value` breaks."""
    return [message for _, message in cel_errors_at(schema, value, "", env)]


def cel_errors_at(schema: dict[str, Any], value: Any, where: str,
                  env: celpy.Environment | None = None) -> list[tuple[str, str]]:
    """(path, message) of every rule that `value` breaks, the path as the API server prints
    it (`spec.adapters[1].uri`)."""
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"])) if env else _program(rule["rule"])
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            errors.append((where, rule["message"]))
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors += cel_errors_at(sub, value[name], f"{where}.{name}".lstrip("."), env)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += cel_errors_at(schema["items"], item, f"{where}[{i}]", env)
    return errors


@functools.cache
def _program(rule: str) -> Any:
    """A rule compiled in CEL's default environment, once per process."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def api_path(parts: Any) -> str:
    """A path as the API server prints it: `spec.adapters[1].name`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def duplicate_keys(schema: dict[str, Any], value: Any, where: str = "") -> list[str]:
    """The API server's refusal of a map-typed list (x-kubernetes-list-type: map) with two
    entries of the same keys: `spec.adapters[1]: Duplicate value: map[string]interface
    {}{"name":"a"}` (apiextensions-apiserver structural listtype validation)."""
    errors = []
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen = set()
        for i, item in enumerate(value):
            if schema.get("x-kubernetes-list-type") == "map" and isinstance(item, dict):
                key = tuple((k, json.dumps(item.get(k))) for k in keys)
                if key in seen:
                    shown = ",".join(f'"{k}":{v}' for k, v in key)
                    errors.append(f"{where}[{i}]: Duplicate value: map[string]interface "
                                  f"{{}}{{{shown}}}")
                seen.add(key)
            errors += duplicate_keys(schema["items"], item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors += duplicate_keys(sub, value[name], f"{where}.{name}".lstrip("."))
    return errors


# apiextensions-apiserver pkg/registry/customresource/strategy.go, hasBlockingErr: OpenAPI
# errors of these types (enum -> NotSupported, required, maxLength -> TooLong,
# maxItems/maxProperties -> TooMany, type -> TypeInvalid) skip every CEL rule of the object and
# add this one error instead; any other (pattern, minimum, ...: field.Invalid) lets them run.
BLOCKING = {"enum", "required", "maxLength", "maxItems", "maxProperties", "type"}
SKIPPED_RULES = ("some validation rules were not checked because the object was invalid; "
                 "correct the existing errors to complete validation")


def admission_errors(obj: dict[str, Any], schema: dict[str, Any] | None = None,
                     paths: bool = False) -> list[str]:
    """What the API server would say to `kubectl apply` of this object (empty: accepted), for
    the CRD's schema or `schema`; with `paths`, each message after the path the API server
    puts before it (`spec.adapters[1].uri: Invalid value: ...: MESSAGE`).

    Unknown fields first: with strict field validation (kubectl's default) the decoder refuses
    them with a 400 before the object is validated (apiserver handlers/create.go). Then defaults,
    the OpenAPI schema, map-typed lists' duplicate keys, and the CEL rules unless a schema error
    blocks them (BLOCKING)."""
    schema = schema or crd_schema()
    unknown = _unknown_fields(schema, obj, "")
    if unknown:
        return unknown
    defaulted = with_defaults(schema, obj)
    found = list(jsonschema.Draft4Validator(_int_or_string_typed(schema)).iter_errors(defaulted))
    errors = [f"{api_path(e.path) if paths else '.'.join(map(str, e.path))}: {e.message}"
              for e in found] + duplicate_keys(schema, defaulted)
    if any(e.validator in BLOCKING for e in found):
        return [*errors, SKIPPED_RULES]
    if paths:
        return errors + [f"{where}: Invalid value: {message}" if where else message
                         for where, message in cel_errors_at(schema, defaulted, "")]
    return errors + cel_errors(schema, defaulted)


def _int_or_string_typed(schema: Any) -> Any:
    """The schema as the API server validates with it: an x-kubernetes-int-or-string node has
    type [integer, string] (apiextensions-apiserver validation.go,
    ConvertJSONSchemaPropsWithPostProcess), so `cpu: true` is a type error."""
    if isinstance(schema, list):
        return [_int_or_string_typed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _int_or_string_typed(v) for k, v in schema.items()}
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    return out


def _unknown_fields(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    """Fields the schema does not declare (kubectl's strict field validation rejects them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [e for i, item in enumerate(value)
                for e in _unknown_fields(schema["items"], item, f"{where}{i}.")]
    if not isinstance(value, dict):
        return []
    props = schema.get("properties")
    if props is None:
        extra = schema.get("additionalProperties")
        return [e for k, v in value.items() for e in _unknown_fields(extra, v, f"{where}{k}.")
                ] if isinstance(extra, dict) else []
    errors = [f"{where}{k}: unknown field" for k in value if k not in props]
    return errors + [e for k, v in value.items() if k in props
                     for e in _unknown_fields(props[k], v, f"{where}{k}.")]


def render_chart(values: dict | None = None) -> list[dict]:
    """The chart's objects, rendered by Helm's own engine (helm-python-sdk)."""
    import helm_python

    chart = helm_python.Chart.load(str(REPO / "charts" / "tokenmill"))
    rendered = chart.render(values or {}, name="tm", namespace="tokenmill")
    docs = []
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def granted(docs: list[dict], kind: str = "ClusterRole") -> set[tuple[str, str, str]]:
    """(group, resource, verb) every role of `kind` in the rendered chart grants."""
    return {(group, resource, verb) for role in docs if role["kind"] == kind
            for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


SERVER_ARGS = 10  # tokenmill serve --host H --port P --served-model-name N --shutdown-timeout S


def pod_template(spec: dict[str, Any], name: str = "svc") -> dict[str, Any]:
    """The pod spec of the Deployment the operator makes of `spec`."""
    deployment = manifests.children(name, "team", "uid-9", load(name, spec), "tokenmill:1")[0]
    return deployment["spec"]["template"]["spec"]


def served_config(spec: dict[str, Any], name: str = "svc") -> EngineConfig:
    """The engine container's flags as `tokenmill serve` parses them."""
    command = pod_template(spec, name)["containers"][0]["command"]
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_arguments(parser)
    return engine_config_from_args(parser.parse_args(command[SERVER_ARGS:]))


def inference_service(name: str, spec: dict[str, Any], ns: str = "default",
                      uid: str = "uid-1", generation: int = 1) -> dict[str, Any]:
    """An InferenceService as the API server would store it (kmock sets no uid, generation or
    resourceVersion)."""
    return {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "generation": generation,
                         "resourceVersion": "1"},
            "spec": spec}


# --- a running operator against kmock's emulator -------------------------------------------

RESOURCES = {
    "tokenmill.io/v1alpha1/inferenceservices": ("InferenceService", ["status", "scale"]),
    "apps/v1/deployments": ("Deployment", ["status", "scale"]),
    "v1/services": ("Service", ["status"]),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", ["status"]),
    "v1/events": ("Event", []),
    "v1/pods": ("Pod", ["status"]),  # read by the built-in autoscaler
    # Served so that a read of the API key's Secret would be seen: the operator makes none.
    "v1/secrets": ("Secret", []),
    # kopf's discovery waits for these two to be served, even when it does not watch them.
    "v1/namespaces": ("Namespace", []),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", []),
}
CLUSTER_SCOPED = ("Namespace", "CustomResourceDefinition")
KIND_OF = {key.rpartition("/")[2]: kind for key, (kind, _) in RESOURCES.items()}
VERBS = ["get", "list", "watch", "create", "patch", "update", "delete"]


class Cluster:
    """HTTP access to the emulator, as kubectl (or a controller) would touch objects."""

    def __init__(self, session: aiohttp.ClientSession, log: Path, liveness: str,
                 metrics: str = "", emulator: Emulator | None = None):
        self.session = session
        # The RBAC each operator request needed, the field managers of its writes, and the
        # label selectors of its watches.
        self.calls = emulator.calls if emulator is not None else []
        self.managers = emulator.managers if emulator is not None else []
        self.selectors = emulator.selectors if emulator is not None else {}
        self.log = log
        self.liveness = liveness  # the operator's liveness URL
        self.metrics = metrics  # the operator's own /metrics
        self.log_start = 0  # where the running operator process's log begins
        self.restart: Callable[[], Awaitable[None]] = _no_restart

    async def handled_since_start(self, handler: str) -> bool:
        """Whether the running operator process has completed `handler` at least once (kopf
        logs each success at INFO, which --verbose shows)."""
        lines = self.log.read_text()[self.log_start:].splitlines()
        return any(f"Handler '{handler}" in line and line.rstrip().endswith("succeeded.")
                   for line in lines)

    async def request(self, method: str, path: str, body: Any = None) -> dict | None:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with self.session.request(method, path, json=body, headers=headers) as resp:
            if resp.status == 404:
                return None
            assert resp.status < 300, f"{method} {path}: {resp.status} {await resp.text()}"
            return await resp.json()

    async def get(self, path: str) -> dict | None:
        return await self.request("GET", path)

    async def events(self, ns: str = "default") -> list[dict]:
        found = await self.get(f"/api/v1/namespaces/{ns}/events")
        return found["items"] if found else []

    async def eventually(self, check: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
        """Poll `check` until it returns something truthy; fail with the operator's log."""
        deadline = time.monotonic() + timeout
        while True:
            result = await check()
            if result:
                return result
            if time.monotonic() > deadline:
                tail = self.log.read_text()[-4000:]
                raise AssertionError(f"not reached in {timeout}s; operator log:\n{tail}")
            await asyncio.sleep(0.1)


VERB_OF = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create",
           "DELETE": "delete"}


Refusals = dict[tuple[str, str], tuple[int, str | Callable[[], str]]]


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the API server's generateName (kopf names its Events so), its
    canonical quantities and its annotation size limit (apiserver_model.writes); records the
    RBAC permission each request needs (rbac_needed), as the API server's authorizer and
    admission plugins would ask for it; plays a server of version 1.`minor`, which drops the
    Deployment fields it does not know or keep and warns about the unknown ones
    (apiserver_model.versions)."""

    calls: list[tuple[str, str, str]]  # (API group, resource[/subresource], verb)
    # (resource[/subresource], field manager) of each write the operator made
    managers: list[tuple[str, str]]
    selectors: dict[str, str | None]  # resource -> label selector of the operator's watch
    # (resource, verb) -> (HTTP status, message): how the API server answers such a request,
    # e.g. a 422 for a Deployment the Deployment API finds invalid, a 403 from RBAC. A callable
    # message is called for every answer (a message that embeds Go pointers changes each time).
    refuse: Refusals
    minor: int = 31

    async def _handle(self, request: kmock.Request) -> Any:
        meta = request.data.get("metadata") if isinstance(request.data, dict) else None
        if request.action == kmock.action.CREATE and meta and "generateName" in meta:
            meta.setdefault("name", meta["generateName"] + uuid.uuid4().hex[:8])
        operator = "authorization" in {h.lower() for h in request.headers}  # not the test's
        if operator and request.action is not None and request.resource is not None and \
                request.resource.plural:  # discovery is open to every authenticated user
            needed = _permissions(request, meta)
            self.calls.extend(needed)
            if request.action.value == "WATCH":
                self.selectors[request.resource.plural] = request.params.get("labelSelector")
            if request.method in ("POST", "PUT", "PATCH"):
                self.managers.append((needed[0][1], field_manager(request)))
            if refusal := self.refuse.get(needed[0][1:]):
                message = refusal[1]() if callable(refusal[1]) else refusal[1]
                raise kmock.KubernetesError(status=refusal[0], reason="Refused",
                                            message=message)
        warnings = self._drop_unknown(request)
        if request.resource is not None and isinstance(request.data, dict):
            self._as_stored(request)
        response = await super()._handle(request)
        for text in warnings:
            response.headers.add("Warning", warning_header(text))
        return response

    def _drop_unknown(self, request: kmock.Request) -> list[str]:
        """What this server version drops from a written Deployment, and its warnings."""
        resource = request.resource
        writes = (kmock.action.CREATE, kmock.action.UPDATE)
        if (resource is None or resource.plural != "deployments" or request.action not in writes
                or not isinstance(request.data, dict)):
            return []
        return drop_unknown(request.data, self.minor)

    async def _serve_server_version(self, request: kmock.Request) -> dict[str, str]:
        """GET /version, as kube-apiserver answers it (k8s.io/apimachinery version.Info)."""
        return {"major": "1", "minor": str(self.minor), "gitVersion": f"v1.{self.minor}.0",
                "platform": "linux/amd64"}

    def _as_stored(self, request: kmock.Request) -> None:
        """Canonical quantities and no empty optional fields in what is written, and the 422
        for annotations over the limit, judged on the object as it would be after the write."""
        kind = KIND_OF.get(request.resource.plural, "")
        try:
            canonicalize(kind, request.data)
        except ValueError as e:  # the JSON decoder's refusal of a malformed quantity
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(e)) from None
        omit_empty(kind, request.data, patch=request.action == kmock.action.UPDATE)
        default_volumes(kind, request.data)
        after = request.data
        if request.action == kmock.action.UPDATE:
            key = (request.resource, request.namespace, request.name)
            known = key in self.objects and not self.objects[key].deleted
            after = merge_patch(self.objects[key].raw if known else {}, request.data)
        name = request.name or (request.data.get("metadata") or {}).get("name", "")
        if fields := too_long(kind, after):
            raise _invalid(kind, request.resource.group, name, fields)
        if kind == "Event" and (errors := event_errors(after)):
            raise kmock.KubernetesError(status=422, reason="Invalid",
                                        message=f'Event "{name}" is invalid: ' + ", ".join(errors))


def _invalid(kind: str, group: str | None, name: str, fields: list[str]) -> kmock.KubernetesError:
    """A 422 Status as the API server words it (StatusError from field.ErrorList)."""
    qualified = f"{kind}.{group}" if group else kind
    causes = [{"reason": "FieldValueTooLong", "message": TOO_LONG, "field": f} for f in fields]
    message = f'{qualified} "{name}" is invalid: ' + ", ".join(f"{f}: {TOO_LONG}" for f in fields)
    return kmock.KubernetesError(
        status=422, reason="Invalid", message=message,
        details={"name": name, "group": group or "", "kind": kind.lower() + "s",
                 "causes": causes})


def field_manager(request: kmock.Request) -> str:
    """The manager the API server records for a write that is not an apply: the fieldManager
    query parameter, else the User-Agent up to its first "/", printable characters only, at
    most 128 (k8s.io/apiserver endpoints/handlers: prefixFromUserAgent)."""
    if manager := request.params.get("fieldManager"):
        return manager
    agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
    return "".join(c for c in agent.split("/")[0] if c.isprintable())[:128]


def _permissions(request: kmock.Request, meta: dict | None) -> list[tuple[str, str, str]]:
    """RBAC (group, resource, verb) a real API server checks for one request.

    Besides the verb on the resource, OwnerReferencesPermissionEnforcement (an admission
    plugin, on by default in OpenShift) asks for `update` on the owner's finalizers
    subresource when a written object sets blockOwnerDeletion on an owner reference."""
    resource = request.resource.plural + (f"/{request.subresource}" if request.subresource
                                          else "")
    action = request.action.value
    verb = VERB_OF.get(action) or ("patch" if request.method == "PATCH" else "update")
    needed = [(request.resource.group or "", resource, verb)]
    for ref in (meta or {}).get("ownerReferences", []):
        if ref.get("blockOwnerDeletion") and action in ("CREATE", "UPDATE"):
            group = ref["apiVersion"].rpartition("/")[0]
            needed.append((group, f"{ref['kind'].lower()}s/finalizers", "update"))
    return needed


def _kubeconfig(url: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {"token": "test"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    })


async def _no_restart() -> None:
    raise NotImplementedError("only running_operator's clusters restart an operator")


async def _start_operator(tmp_path: Path, env: dict[str, str], log: Path, liveness: str,
                          metrics_port: int, verbose: bool) -> asyncio.subprocess.Process:
    """`tokenmill operator` as a real process (standalone, no peering), appending to `log`."""
    with log.open("a") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "tokenmill.operator", "--standalone",
            "--liveness", liveness, "--metrics-port", str(metrics_port),
            *(["--verbose"] if verbose else []),
            cwd=tmp_path, env=env, stdout=out, stderr=out)


async def _stop_operator(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, as the kubelet stops a pod; SIGKILL after 10 s."""
    if proc.returncode is None:
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def running_operator(tmp_path: Path, env: dict[str, str] | None = None,
                           verbose: bool = True,
                           refuse: Refusals | None = None, minor: int = 31,
                           resources: dict[str, tuple[str, list[str]]] | None = None,
                           ) -> AsyncIterator[Cluster]:
    """The emulator serving every resource the operator touches, and `tokenmill operator`
    running against it as a real process (standalone, no peering); `env` adds variables,
    `refuse` makes the API server answer some of the operator's requests with an error,
    `minor` is the API server's version (1.minor), `resources` serves more resources (as
    RESOURCES: "group/version/plural" -> (kind, subresources)). `Cluster.restart()` replaces
    the process with a new one against the same emulator, as an upgrade or a rescheduled
    operator pod would."""
    async with Emulator() as emu, kmock.Server(emu):
        emu.calls = []
        emu.managers = []
        emu.selectors = {}
        emu.refuse = refuse or {}
        emu.minor = minor
        for key, (kind, subresources) in {**RESOURCES, **(resources or {})}.items():
            emu.resources[key] = kmock.ResourceInfo(
                kind=kind, namespaced=kind not in CLUSTER_SCOPED, verbs=VERBS,
                subresources=subresources)
        config = tmp_path / "kubeconfig"
        config.write_text(_kubeconfig(str(emu.url).rstrip("/")))
        log = tmp_path / "operator.log"
        log.write_text("")
        env = {**os.environ, "KUBECONFIG": str(config), "TOKENMILL_ENGINE_IMAGE": "tokenmill:test",
               **(env or {})}
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        metrics_port = free_port()
        procs = [await _start_operator(tmp_path, env, log, liveness, metrics_port, verbose)]
        try:
            async with aiohttp.ClientSession(base_url=str(emu.url)) as session:
                cluster = Cluster(session, log, liveness,
                                  f"http://127.0.0.1:{metrics_port}/metrics", emu)

                async def restart() -> None:
                    await _stop_operator(procs[-1])
                    cluster.log_start = len(log.read_text())
                    procs.append(await _start_operator(tmp_path, env, log, liveness,
                                                       metrics_port, verbose))

                cluster.restart = restart
                yield cluster
            assert procs[-1].returncode is None, (
                f"the operator exited:\n{log.read_text()[-4000:]}")
        finally:
            await _stop_operator(procs[-1])


async def http_server(path: str, handler: Callable) -> tuple[aiohttp.web.AppRunner, int]:
    """A real HTTP server on 127.0.0.1 answering GET `path` with `handler` (an engine's
    /metrics or /health as the operator reads it); clean up with `await runner.cleanup()`."""
    app = aiohttp.web.Application()
    app.router.add_get(path, handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def engine_exposition(waiting: int, running: int) -> str:
    """What `tokenmill serve` answers on /metrics, from the engine's own metrics class."""
    metrics = EngineMetrics("smollm2")
    metrics.waiting.labels("smollm2").set(waiting)
    metrics.running.labels("smollm2").set(running)
    return generate_latest(metrics.registry).decode()
