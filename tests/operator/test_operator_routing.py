"""spec.routing.inferencePool (an InferencePool, its endpoint picker, an HTTPRoute) and
spec.autoscaling.mode keda (a KEDA ScaledObject): admitted or refused naming the spec's
fields, rendered as objects the upstream APIs' schemas accept (upstream_schemas.py, written
from their documentation; kubernetes-validate for the built-in kinds), and written by the
running operator on kmock, where the cluster serves those APIs, or named as missing where it
does not."""

from __future__ import annotations

import asyncio

import kubernetes_validate
import pytest
import upstream_schemas
import yaml
from operator_support import (
    IS_PATH,
    REPO,
    admission_errors,
    granted,
    inference_service,
    render_chart,
    running_operator,
)

from tokenmill.operator import keda, manifests, routing
from tokenmill.operator.reconcile import load
from tokenmill.operator.spec import (
    DEFAULT_EPP_IMAGE,
    KEDA_NEEDS_SETTINGS,
    KEDA_SETTINGS_ONLY,
    MIN_REPLICAS_MESSAGE,
    ROUTED_NAME_MESSAGE,
    SpecError,
)

PROM = "http://prometheus-operated.monitoring.svc:9090"
EXAMPLE = REPO / "examples" / "gateway" / "two-models.yaml"
POOL = {"routing": {"inferencePool": {}}}
GATEWAY = {"routing": {"inferencePool": {"gateway": {"name": "inference-gw",
                                                     "namespace": "gateways"}}}}
KEDA = {"autoscaling": {"mode": "keda", "minReplicas": 0, "maxReplicas": 6,
                        "keda": {"serverAddress": PROM}}}


def _obj(spec: dict, name: str = "chat") -> dict:
    return {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name}, "spec": spec}


def _children(spec: dict, name: str = "chat") -> list[dict]:
    parsed = load(name, spec)
    return (manifests.children(name, "team", "uid-1", parsed, "tokenmill:1")
            + routing.children(name, "team", "uid-1", parsed)
            + keda.children(name, "team", "uid-1", parsed))


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind
                and (name is None or o["metadata"]["name"] == name)]
    return found


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


# --- manifests ---------------------------------------------------------------------------------

TIMED = {"routing": {"inferencePool": {"gateway": {"name": "gw", "requestTimeout": "1h30m"}}}}
# The longest delay and polling interval admitted: the HPA KEDA makes from them must be valid
# (autoscaling/v2 caps a stabilization window at 3600 s and a policy's period at 1800 s).
SLOW_KEDA = {"autoscaling": {"mode": "keda", "scaleDownDelaySeconds": 3600, "keda": {
    "serverAddress": PROM, "pollingIntervalSeconds": 3600}}}


@pytest.mark.parametrize("spec", [POOL, GATEWAY, KEDA, {**GATEWAY, **KEDA}, TIMED, SLOW_KEDA],
                         ids=["pool", "gateway", "keda", "all", "timeout", "slow-keda"])
def test_every_object_passes_its_apis_schema(spec):
    for obj in _children(spec):
        if (obj["apiVersion"], obj["kind"]) in upstream_schemas.SCHEMAS:
            assert upstream_schemas.errors(obj) == [], obj["kind"]
        else:
            kubernetes_validate.validate(obj, "1.31", strict=True)


def test_the_schemas_refuse_what_the_apis_refuse():
    """The schemas written from the documentation are not vacuous."""
    pool = _one(_children(POOL), "InferencePool")
    bad_pool = {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 8000},
                                                                 {"number": 8001}]}}
    assert upstream_schemas.errors(bad_pool)
    no_port = {**pool, "spec": {**pool["spec"], "endpointPickerRef": {"name": "x"}}}
    assert upstream_schemas.errors(no_port) == [
        "spec.endpointPickerRef: port is required when kind is 'Service'"]
    old_field = {**pool, "spec": {**pool["spec"], "targetPortNumber": 8000}}
    assert upstream_schemas.errors(old_field)  # v1alpha2's field is not v1's
    route = _one(_children(GATEWAY), "HTTPRoute")
    to_service = {**route, "spec": {**route["spec"], "rules": [
        {"backendRefs": [{"name": "chat"}]}]}}
    assert upstream_schemas.errors(to_service) == [
        "spec.rules[0].backendRefs[0]: Must have port for Service reference"]
    scaled = _one(_children(KEDA), "ScaledObject")
    inverted = {**scaled, "spec": {**scaled["spec"], "minReplicaCount": 7}}
    assert upstream_schemas.errors(inverted) == [
        "MinReplicaCount=7 must be less than MaxReplicaCount=6"]
    assert upstream_schemas.errors({**scaled, "spec": {**scaled["spec"], "triggers": []}})


def test_the_pool_selects_the_engines_and_names_the_picker():
    objects = _children(POOL)
    pool = _one(objects, "InferencePool", "chat")
    engine_pods = _one(objects, "Deployment", "chat")["spec"]["template"]["metadata"]["labels"]
    picker = _one(objects, "Deployment", "chat-epp")
    picker_pods = picker["spec"]["template"]["metadata"]["labels"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert _matches(selector, engine_pods) and not _matches(selector, picker_pods)
    # Neither the engines' Service nor their PDB's selector takes the picker's pods.
    assert not _matches(_one(objects, "Service", "chat")["spec"]["selector"], picker_pods)
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    engine = _one(objects, "Deployment", "chat")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in engine["ports"]
    ref = pool["spec"]["endpointPickerRef"]
    assert ref == {"name": "chat-epp", "port": {"number": 9002}, "failureMode": "FailClose"}
    service = _one(objects, "Service", "chat-epp")
    assert _matches(service["spec"]["selector"], picker_pods)
    assert {"name": "grpc-ext-proc", "port": 9002, "targetPort": "grpc", "protocol": "TCP",
            "appProtocol": "http2"} in service["spec"]["ports"]


def test_the_picker_runs_for_this_pool_with_its_own_account():
    objects = _children({"routing": {"inferencePool": {"endpointPicker": {
        "replicas": 2, "failureMode": "FailOpen", "flowControl": True}}}})
    picker = _one(objects, "Deployment", "chat-epp")
    pod = picker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert container["image"] == DEFAULT_EPP_IMAGE
    assert args[args.index("--pool-name") + 1] == "chat"
    assert args[args.index("--pool-namespace") + 1] == "team"
    assert args[args.index("--pool-group") + 1] == "inference.networking.k8s.io"
    config = args[args.index("--config-text") + 1]
    assert "flowControl" in config and "prefix-cache-scorer" in config
    # vLLM's metric names are the engine's aliases: no metric flag overrides the defaults.
    assert not any("metric" in a for a in args if a.startswith("--"))
    assert {p["containerPort"] for p in container["ports"]} == {9002, 9003, 9090}
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert picker["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "chat-epp"
    binding = _one(objects, "RoleBinding", "chat-epp")
    assert binding["roleRef"]["name"] == "chat-epp"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-epp",
                                    "namespace": "team"}]
    rules = _one(objects, "Role", "chat-epp")["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {
        "pods", "inferencepools", "inferenceobjectives"}
    assert all(rule["verbs"] == ["get", "list", "watch"] for rule in rules)
    assert _one(objects, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    for obj in objects:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == (
            "InferenceService", "chat", True)


def test_the_route_sends_the_gateways_traffic_to_the_pool():
    route = _one(_children(GATEWAY), "HTTPRoute", "chat")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "name": "inference-gw",
                                            "namespace": "gateways"}]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool", "name": "chat"}]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert "timeouts" not in rule  # the gateway's own default


def test_the_route_waits_as_long_as_the_spec_asks():
    """Scale from zero holds requests while the first pod loads: the route's request timeout
    is the user's, written as the Gateway API's duration."""
    spec = {"routing": {"inferencePool": {"gateway": {"name": "gw", "requestTimeout": "15m"}}}}
    (rule,) = _one(_children(spec), "HTTPRoute")["spec"]["rules"]
    assert rule["timeouts"] == {"request": "15m"}


def test_by_model_name_the_route_takes_the_served_name_and_every_adapter():
    spec = {"model": {"uri": "/models/llama", "servedName": "llama"},
            "adapters": [{"name": "sql", "uri": "/models/sql"}],
            "routing": {"inferencePool": {"gateway": {"name": "gw", "matchModelName": True}}}}
    (rule,) = _one(_children(spec), "HTTPRoute")["spec"]["rules"]
    headers = [m["headers"] for m in rule["matches"]]
    assert headers == [[{"type": "Exact", "name": "X-Gateway-Model-Name", "value": v}]
                       for v in ("llama", "sql")]


def test_keda_scales_the_inference_service_on_its_queue():
    scaled = _one(_children(KEDA), "ScaledObject", "chat")["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "tokenmill.io/v1alpha1",
                                        "kind": "InferenceService", "name": "chat"}
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (0, 6)
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == PROM and meta["threshold"] == "4"
    assert 'tokenmill_num_requests_waiting{namespace="team",model_name="chat"}' in meta["query"]
    assert "flow_control" not in meta["query"]  # no pool, no picker queue
    assert scaled["cooldownPeriod"] == 300
    assert scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 300}
    pooled = _one(_children({**KEDA, **POOL}), "ScaledObject")["spec"]["triggers"][0]
    assert 'inference_extension_flow_control_queue_size{inference_pool="chat"}' in pooled[
        "metadata"]["query"]
    own = {**KEDA, "autoscaling": {**KEDA["autoscaling"], "keda": {
        "serverAddress": PROM, "query": "sum(my_queue)", "pollingIntervalSeconds": 5}}}
    scaled = _one(_children(own), "ScaledObject")["spec"]
    assert scaled["triggers"][0]["metadata"]["query"] == "sum(my_queue)"
    assert scaled["pollingInterval"] == 5


def test_in_mode_keda_the_deployment_follows_spec_replicas_as_written():
    """KEDA's HPA owns spec.replicas through the scale subresource: the operator neither
    bounds it nor scales (the built-in autoscaler runs only in mode builtin)."""
    parsed = load("chat", {**KEDA, "replicas": 0})
    assert parsed.desired_replicas == 0
    deployment = manifests.children("chat", "team", "u", parsed, "tokenmill:1")[0]
    assert deployment["spec"]["replicas"] == 0


def test_off_or_absent_writes_nothing():
    for spec in ({}, {"routing": {}}, {"routing": {"inferencePool": {"enabled": False}}},
                 {"autoscaling": {"mode": "external"}}):
        kinds = {o["kind"] for o in _children(spec)}
        assert kinds <= {"Deployment", "Service", "PodDisruptionBudget"}
        assert len([o for o in _children(spec) if o["kind"] == "Deployment"]) == 1


def test_the_operator_may_grant_the_picker_what_its_role_grants():
    """The API server refuses a Role granting more than its creator holds (RBAC escalation
    prevention): the chart gives the operator every permission of the picker's Role, cluster
    wide and per watched namespace."""
    needed = {(group, resource, verb) for rule in routing.picker_rules()
              for group in rule["apiGroups"] for resource in rule["resources"]
              for verb in rule["verbs"]}
    assert needed <= granted(render_chart())
    assert needed <= granted(render_chart({"watchNamespaces": ["ml"]}), "Role")


# --- admission: the CRD's schema and rules, and the operator's own check ---------------------

ADMITTED = [
    POOL, GATEWAY, KEDA, {**GATEWAY, **KEDA}, SLOW_KEDA,
    {"autoscaling": {"scaleDownDelaySeconds": 7200}},  # the built-in autoscaler has no cap
    {"routing": {"inferencePool": {"enabled": False}}},
    {"autoscaling": {"mode": "external", "minReplicas": 0}},
    {"autoscaling": {"mode": "keda", "keda": {"serverAddress": "https://prom.example:9443/p"}}},
]


@pytest.mark.parametrize("spec", ADMITTED, ids=[str(i) for i in range(len(ADMITTED))])
def test_admitted_and_deployable(spec):
    assert admission_errors(_obj(spec)) == []
    load("chat", spec)


REFUSED = [
    # The built-in autoscaler and KEDA are exclusive: one field says which scales.
    ({"autoscaling": {"mode": "keda"}}, "spec.autoscaling.keda"),
    ({"autoscaling": {"keda": {"serverAddress": PROM}}}, "spec.autoscaling.keda"),
    ({"autoscaling": {"mode": "builtin", "keda": {"serverAddress": PROM}}},
     "spec.autoscaling.keda"),
    ({"autoscaling": {"mode": "external", "keda": {"serverAddress": PROM}}},
     "spec.autoscaling.keda"),
    ({"autoscaling": {"minReplicas": 0}}, "spec.autoscaling.minReplicas"),
    ({"autoscaling": {"mode": "builtin", "minReplicas": 0}}, "spec.autoscaling.minReplicas"),
    ({"autoscaling": {"mode": "keda", "minReplicas": 3, "maxReplicas": 2,
                      "keda": {"serverAddress": PROM}}}, "autoscaling.minReplicas"),
    ({"autoscaling": {"mode": "keda", "keda": {"serverAddress": "prometheus:9090"}}},
     "spec.autoscaling.keda.serverAddress"),
    ({"autoscaling": {"mode": "keda", "keda": {}}}, "serverAddress"),
    ({"autoscaling": {"mode": "keda", "scaleDownDelaySeconds": 3601,
                      "keda": {"serverAddress": PROM}}}, "spec.autoscaling.scaleDownDelaySeconds"),
    ({"autoscaling": {"mode": "keda", "keda": {"serverAddress": PROM,
                                               "pollingIntervalSeconds": 0}}},
     "spec.autoscaling.keda.pollingIntervalSeconds"),
    ({"routing": {"inferencePool": {"endpointPicker": {"replicas": 0}}}},
     "spec.routing.inferencePool.endpointPicker.replicas"),
    ({"routing": {"inferencePool": {"endpointPicker": {"failureMode": "Open"}}}},
     "spec.routing.inferencePool.endpointPicker.failureMode"),
    ({"routing": {"inferencePool": {"endpointPicker": {"image": "epp: v1"}}}},
     "spec.routing.inferencePool.endpointPicker.image"),
    ({"routing": {"inferencePool": {"gateway": {"namespace": "gateways"}}}}, "name"),
    ({"routing": {"inferencePool": {"gateway": {"name": "gw", "namespace": "Gate.ways"}}}},
     "spec.routing.inferencePool.gateway.namespace"),
    ({"routing": {"inferencePool": {"selector": {"app": "x"}}}},
     "spec.routing.inferencePool.selector"),
    ({"routing": {"inferencePool": {"gateway": {"name": "gw", "requestTimeout": "15 min"}}}},
     "spec.routing.inferencePool.gateway.requestTimeout"),
    ({"routing": {"inferencePool": {"gateway": {"name": "gw", "requestTimeout": "1.5h"}}}},
     "spec.routing.inferencePool.gateway.requestTimeout"),
]


def _names(field: str, message: str) -> bool:
    parent, _, leaf = field.rpartition(".")
    return field in message or (leaf in message and (not parent or parent in message))


@pytest.mark.parametrize(("spec", "field"), REFUSED, ids=[str(s) for s, _ in REFUSED])
def test_refused_at_apply_and_by_the_operator_naming_the_field(spec, field):
    errors = admission_errors(_obj(spec))
    assert any(_names(field, e) for e in errors), errors
    with pytest.raises(SpecError) as refused:
        load("chat", spec)
    assert _names(field, str(refused.value)), refused.value


EXCLUSIVE = [({"autoscaling": {"mode": "keda"}}, KEDA_NEEDS_SETTINGS),
             ({"autoscaling": {"keda": {"serverAddress": PROM}}}, KEDA_SETTINGS_ONLY),
             ({"autoscaling": {"minReplicas": 0}}, MIN_REPLICAS_MESSAGE)]


@pytest.mark.parametrize(("spec", "message"), EXCLUSIVE, ids=["keda", "builtin", "zero"])
def test_the_built_in_autoscaler_and_keda_are_exclusive_and_admission_says_why(spec, message):
    """One mode scales: KEDA's settings only in mode keda (a ScaledObject beside the built-in
    autoscaler would fight it over spec.replicas), and scale to zero only where demand is seen
    before a pod is."""
    assert admission_errors(_obj(spec)) == [message]
    with pytest.raises(SpecError) as refused:
        load("chat", spec)
    assert message.removeprefix("spec.autoscaling.") in str(refused.value) or (
        "0 needs mode keda or external" in str(refused.value))


def test_a_name_too_long_for_the_pickers_service_is_refused_with_routing_only():
    name = "a" * 61
    assert admission_errors(_obj(POOL, name)) == [ROUTED_NAME_MESSAGE]
    with pytest.raises(SpecError, match="metadata.name must be at most 59"):
        load(name, POOL)
    assert admission_errors(_obj({}, name)) == []
    assert admission_errors(_obj({"routing": {"inferencePool": {"enabled": False}}}, name)) == []


# --- the operator on kmock ----------------------------------------------------------------------

NS = "default"
ISVCS = IS_PATH.format(ns=NS)
APIS = {"pool": "/apis/inference.networking.k8s.io/v1",
        "route": "/apis/gateway.networking.k8s.io/v1", "keda": "/apis/keda.sh/v1alpha1"}
POOL_PATH = f"{APIS['pool']}/namespaces/{NS}/inferencepools/chat"
ROUTE_PATH = f"{APIS['route']}/namespaces/{NS}/httproutes/chat"
SCALED_PATH = f"{APIS['keda']}/namespaces/{NS}/scaledobjects/chat"
PICKER = f"/apis/apps/v1/namespaces/{NS}/deployments/chat-epp"
PICKER_SERVICE = f"/api/v1/namespaces/{NS}/services/chat-epp"
PICKER_ACCOUNT = f"/api/v1/namespaces/{NS}/serviceaccounts/chat-epp"
RBAC = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}"
PICKER_RBAC = (f"{RBAC}/roles/chat-epp", f"{RBAC}/rolebindings/chat-epp")
# What a cluster with the Gateway API, its inference extension and KEDA serves (and the
# namespaced kinds the picker's identity needs, which every cluster serves).
SERVED = {
    "inference.networking.k8s.io/v1/inferencepools": ("InferencePool", ["status"]),
    "gateway.networking.k8s.io/v1/httproutes": ("HTTPRoute", ["status"]),
    "keda.sh/v1alpha1/scaledobjects": ("ScaledObject", ["status"]),
}
IDENTITY = {
    "v1/serviceaccounts": ("ServiceAccount", []),
    "rbac.authorization.k8s.io/v1/roles": ("Role", []),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", []),
}
SPEC = {"model": {"uri": "smollm2-135m-instruct"}, "resources": {"gpus": 0},
        **GATEWAY, **KEDA}


def condition(isvc: dict | None, type_: str) -> dict:
    conds = ((isvc or {}).get("status") or {}).get("conditions", [])
    return next((c for c in conds if c["type"] == type_), {})


async def _with(k, path: str, check) -> dict | None:
    obj = await k.get(path)
    return obj if obj is not None and check(obj) else None


async def _absent(k, path: str) -> bool:
    return await k.get(path) is None


pytestmark_async = pytest.mark.asyncio


@pytestmark_async
async def test_the_operator_writes_pool_picker_route_and_scaled_object(tmp_path):
    async with running_operator(tmp_path, resources={**SERVED, **IDENTITY}) as k:
        await k.request("POST", ISVCS, inference_service("chat", SPEC))
        children = [await k.eventually(lambda p=p: k.get(p)) for p in (
            POOL_PATH, ROUTE_PATH, SCALED_PATH, PICKER, PICKER_SERVICE, PICKER_ACCOUNT,
            *PICKER_RBAC)]
        for child in children:
            (owner,) = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
                "InferenceService", "chat", "uid-1", True)
            if (child["apiVersion"], child["kind"]) in upstream_schemas.SCHEMAS:
                stored = {k_: v for k_, v in child.items() if k_ != "status"}
                stored["metadata"] = {k_: child["metadata"][k_] for k_ in (
                    "name", "namespace", "labels", "ownerReferences")}
                assert upstream_schemas.errors(stored) == []

        # Until the picker has a replica and KEDA has looked, the conditions say so.
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "RoutingReady").get("reason")
            == "EndpointPickerNotReady"))
        assert condition(isvc, "AutoscalingReady")["status"] == "Unknown"
        # The controllers' part: the picker's Deployment rolls out, KEDA reports Ready.
        await k.request("PATCH", f"{PICKER}/status", {"status": {
            "replicas": 1, "readyReplicas": 1, "availableReplicas": 1}})
        await k.request("PATCH", f"{SCALED_PATH}/status", {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "ScaledObjectReady",
             "message": "ScaledObject is defined correctly and is ready for scaling"}]}})
        await k.request("PATCH", f"{ISVCS}/chat", {"metadata": {"annotations": {"poke": "1"}}})
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "RoutingReady").get("status") == "True"
            and condition(o, "AutoscalingReady").get("status") == "True"))
        assert condition(isvc, "Degraded")["status"] == "False"

        # Mode keda: the built-in autoscaler never writes spec.replicas.
        await asyncio.sleep(1.5)
        assert not [m for m in k.managers if m[1] == "tokenmill-autoscaler"]

        # Removing routing and KEDA from the spec deletes what they wrote.
        await k.request("PATCH", f"{ISVCS}/chat", {"metadata": {"generation": 2}, "spec": {
            "routing": None, "autoscaling": None}})
        for path in (POOL_PATH, ROUTE_PATH, SCALED_PATH, PICKER, PICKER_SERVICE,
                     PICKER_ACCOUNT, *PICKER_RBAC):
            await k.eventually(lambda p=path: _absent(k, p))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: not condition(o, "RoutingReady")
            and not condition(o, "AutoscalingReady")))
        assert await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/chat")  # the engines stay

    # The chart's RBAC covers every call the operator made, as an authorizer would check it.
    missing = set(k.calls) - granted(render_chart())
    assert not missing, f"the chart's RBAC lacks {sorted(missing)}"
    deleted = {c[1] for c in k.calls if c[2] == "delete"}
    assert {"inferencepools", "httproutes", "scaledobjects", "deployments", "services",
            "serviceaccounts", "roles", "rolebindings"} <= deleted


@pytestmark_async
async def test_without_the_apis_the_conditions_name_what_is_missing(tmp_path):
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("chat", SPEC))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "RoutingReady")
            and condition(o, "AutoscalingReady")))
        routing_ = condition(isvc, "RoutingReady")
        assert (routing_["status"], routing_["reason"]) == ("False", "InferencePoolAPIMissing")
        assert "inference.networking.k8s.io/v1 inferencepools" in routing_["message"]
        scaling = condition(isvc, "AutoscalingReady")
        assert (scaling["status"], scaling["reason"]) == ("False", "KEDAMissing")
        assert "keda.sh/v1alpha1 scaledobjects" in scaling["message"]
        # A person must install them: Degraded says so, once, as a Warning.
        assert condition(isvc, "Degraded")["status"] == "True"
        assert condition(isvc, "Degraded")["reason"] in ("InferencePoolAPIMissing",
                                                         "KEDAMissing")
        # The engines serve through their Service regardless.
        assert await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/chat")
        assert await k.get(f"/api/v1/namespaces/{NS}/services/chat")
        assert await _absent(k, PICKER)
    assert not [c for c in k.calls if c[1] in (
        "inferencepools", "httproutes", "scaledobjects", "serviceaccounts", "roles")]


@pytestmark_async
async def test_a_pool_without_the_gateway_api_names_the_gateway_api(tmp_path):
    served = {key: value for key, value in SERVED.items() if "gateway" not in key}
    async with running_operator(tmp_path, resources={**served, **IDENTITY}) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, **GATEWAY}))
        await k.eventually(lambda: k.get(POOL_PATH))
        await k.eventually(lambda: k.get(PICKER))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "RoutingReady").get("reason")
            == "GatewayAPIMissing"))
        assert "gateway.networking.k8s.io/v1 httproutes" in condition(
            isvc, "RoutingReady")["message"]
        assert not condition(isvc, "AutoscalingReady")


def test_the_gateway_example_is_admitted_and_routes_each_model_by_name():
    gateway, *services = yaml.safe_load_all(EXAMPLE.read_text())
    assert gateway["kind"] == "Gateway" and gateway["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert len(services) == 2
    for isvc in services:
        name = isvc["metadata"]["name"]
        assert admission_errors(isvc) == []
        route = _one(_children(isvc["spec"], name), "HTTPRoute")
        assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
        (match,) = route["spec"]["rules"][0]["matches"]
        assert match["headers"][0]["value"] == name
        assert upstream_schemas.errors(route) == []
    scaled = _one(_children(services[1]["spec"], "qwen3-8b"), "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] == 0
    assert "flow_control" in scaled["spec"]["triggers"][0]["metadata"]["query"]


# KEDA's admission webhook, where an HPA of the user's already scales the target.
KEDA_REFUSAL = ("admission webhook \"vscaledobject.kb.io\" denied the request: the workload "
                "'chat' of type 'tokenmill.io/v1alpha1.InferenceService' is already managed by "
                "the hpa 'chat-hpa'")


@pytestmark_async
async def test_a_refused_scaled_object_is_the_autoscaling_condition_and_the_rest_serves(tmp_path):
    """A 403 on a feature's child stopped the whole pass before the status was written; now
    the engines' children are written, the feature's condition says why, and a later pass (the
    resync) writes it once the refusal is gone."""
    refuse = {("scaledobjects", "create"): (403, KEDA_REFUSAL)}
    spec = {"model": {"uri": "smollm2-135m-instruct"}, "resources": {"gpus": 0}, **KEDA}
    async with running_operator(tmp_path, refuse=refuse, resources=SERVED,
                                env={"TOKENMILL_RESYNC_SECONDS": "1"}) as k:
        await k.request("POST", ISVCS, inference_service("chat", spec))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "AutoscalingReady").get("reason")
            == "Forbidden"))
        assert "already managed by the hpa 'chat-hpa'" in condition(
            isvc, "AutoscalingReady")["message"]
        assert condition(isvc, "Ready")["reason"] != "Forbidden"
        assert await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/chat")
        assert await k.get(f"/api/v1/namespaces/{NS}/services/chat")
        await asyncio.sleep(3)  # several resync passes, each refused again
        warned = [e for e in await k.events() if e["reason"] == "Forbidden"]
        assert len(warned) == 1 and warned[0]["type"] == "Warning"
        assert warned[0]["message"].startswith("AutoscalingReady: the API server refused")
        refuse.clear()  # the user removed their HPA
        await k.eventually(lambda: k.get(SCALED_PATH))
