"""The Helm chart, rendered and linted by Helm's own engine (helm-python-sdk)."""

from __future__ import annotations

import asyncio

import helm_python
import helm_python.errors
import kmock
import kubernetes_validate
import pytest
import yaml
from helm_python.config import Config
from openshift_scc import id_violations
from operator_support import CRD_PATH, REPO, Emulator, render_chart
from psa_restricted import violations

from tokenmill.operator.server_versions import MINIMUM

CHART = REPO / "charts" / "tokenmill"


def render(values: dict | None = None) -> list[dict]:
    return render_chart(values)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


VALUES = [{}, {"watchNamespaces": ["ml", "team-b"]}, {"peering": {"enabled": False}},
          {"replicaCount": 2, "engineImage": "registry.local/engine:1", "verbose": True}]


def test_chart_lints_clean():
    report = helm_python.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VALUES, ids=["default", "namespaced", "standalone", "ha"])
def test_rendered_objects_pass_kubernetes_schemas(values):
    for doc in render(values):
        if doc["apiVersion"].startswith("kopf.dev/"):
            continue  # kopf's peering CRDs are in the chart's crds/, not in Kubernetes
        kubernetes_validate.validate(doc, "1.31", strict=True)


def test_chart_ships_the_generated_crd():
    chart = helm_python.Chart.load(str(CHART))
    crds = {c["name"]: c["data"] for c in chart.crds}
    assert crds["crds/inferenceservices.tokenmill.io.yaml"] == CRD_PATH.read_text()
    for doc in yaml.safe_load_all(crds["crds/kopf-peering.yaml"]):
        kubernetes_validate.validate(doc, "1.31", strict=True)


def test_operator_deployment():
    (deployment,) = by_kind(render(VALUES[3]), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-P", "-m", "tokenmill.operator"]
    assert "--peering=tokenmill-operator" in c["args"] and "--verbose" in c["args"]
    assert {"name": "TOKENMILL_ENGINE_IMAGE", "value": "registry.local/engine:1"} in c["env"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--metrics-port=9090" in c["args"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9090"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "tm-tokenmill-operator"


def test_the_operator_pods_security_context_is_a_value():
    """The default passes the restricted profile; a platform that assigns user ids itself
    (OpenShift's restricted-v2 refuses a fixed one) may leave runAsUser out."""
    (deployment,) = by_kind(render({}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert violations(pod) == []
    # Helm merges values into the defaults; a null removes a default's key.
    (deployment,) = by_kind(render({"podSecurityContext": {"runAsUser": None}}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert violations(pod) == []
    # On OpenShift one value leaves the ids out of the operator's pod and the engines'.
    (deployment,) = by_kind(render({"platformAssignedIds": True}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert "--platform-assigned-ids" in pod["containers"][0]["args"]
    assert violations(pod) == [] and id_violations(pod) == []


def test_standalone_and_namespaced_arguments():
    (deployment,) = by_kind(render({"peering": {"enabled": False},
                                    "watchNamespaces": ["ml"]}), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" in args and "--namespace=ml" in args
    assert not any(a.startswith("--cluster-domain") for a in args)
    assert "--platform-assigned-ids" not in args
    (deployment,) = by_kind(render({"clusterDomain": "k8s.corp", "platformAssignedIds": True}),
                            "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cluster-domain=k8s.corp" in args and "--platform-assigned-ids" in args
    (deployment,) = by_kind(render(), "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/tokenmill/tokenmill:0.1.0"


def _rules(docs: list[dict], kind: str) -> list[dict]:
    return [rule for role in by_kind(docs, kind) for rule in role["rules"]]


def test_rbac_is_least_privilege():
    docs = render()
    rules = _rules(docs, "ClusterRole")
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    needed = {("tokenmill.io", "inferenceservices", "watch"),
              ("tokenmill.io", "inferenceservices/status", "patch"),
              ("apps", "deployments", "create"), ("apps", "deployments", "patch"),
              ("", "services", "create"), ("policy", "poddisruptionbudgets", "delete"),
              ("", "events", "create"), ("kopf.dev", "clusterkopfpeerings", "patch")}
    assert needed <= granted
    # An InferenceService's children go by garbage collection; the operator deletes only what
    # the spec stops asking for (the endpoint picker's, when routing goes).
    assert ("apps", "deployments", "update") not in granted
    assert not any(r in ("roles", "rolebindings") and v in ("escalate", "bind")
                   for _, r, v in granted)
    assert not any(r == "secrets" for _, r, _ in granted)
    # Pods are read (status, autoscaler) and never written.
    assert {v for _, r, v in granted if r == "pods"} == {"get", "list", "watch"}
    assert ("tokenmill.io", "inferenceservices/finalizers", "update") in granted


def test_namespaced_install_grants_roles_per_namespace_only():
    docs = render({"watchNamespaces": ["ml", "team-b"]})
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml", "team-b"]
    cluster = {r for rule in _rules(docs, "ClusterRole") for r in rule["resources"]}
    assert cluster == {"customresourcedefinitions", "namespaces"}
    assert sorted(p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")) == [
        "ml", "team-b"]


@pytest.mark.parametrize("values", VALUES, ids=["default", "namespaced", "standalone", "ha"])
def test_the_operator_pod_passes_the_restricted_profile(values):
    (deployment,) = by_kind(render(values), "Deployment")
    template = deployment["spec"]["template"]
    assert violations(template["spec"], template["metadata"].get("annotations")) == []


def test_the_chart_states_the_minimum_kubernetes_version():
    """Helm refuses to install on an older cluster; the bound is the operator's own."""
    major, minor = MINIMUM
    assert helm_python.Chart.load(str(CHART)).metadata["kubeVersion"] == f">={major}.{minor}.0-0"


def test_the_chart_installs_from_the_minimum_version_only(tmp_path):
    """A dry run: Helm compares kubeVersion with the version the API server reports (GET
    /version, the emulator playing an older server) and renders with its own default."""
    chart = helm_python.Chart.load(str(CHART))
    release = Config(kube_apiserver="http://127.0.0.1:1").install(
        chart, "tm", {}, namespace="tokenmill", dry_run="client")
    assert "kind: Deployment" in release["manifest"]

    async def install_on(minor: int) -> str:
        async with Emulator() as emu, kmock.Server(emu):
            emu.calls, emu.selectors, emu.refuse, emu.minor = [], {}, {}, minor
            emu.resources["v1/secrets"] = kmock.ResourceInfo(
                kind="Secret", namespaced=True, verbs=["get", "list", "create"])
            config = Config(kube_apiserver=str(emu.url).rstrip("/"), kube_token="t")
            try:
                await asyncio.to_thread(config.install, chart, "tm", {}, namespace="tokenmill",
                                        dry_run="server")
            except helm_python.errors.HelmError as e:
                return str(e)
            return ""

    too_old = asyncio.run(install_on(MINIMUM[1] - 1))
    assert f"incompatible with Kubernetes v1.{MINIMUM[1] - 1}.0" in too_old
    # At the minimum the version check passes (what follows needs the server's OpenAPI
    # document, which the emulator does not serve).
    assert "kubeVersion" not in asyncio.run(install_on(MINIMUM[1]))
