"""Pure functions from an InferenceService with routing.inferencePool to the objects behind a
Gateway API inference extension: the InferencePool over the engine pods, the endpoint picker
(EPP) it points at (Deployment, Service, and the ServiceAccount, Role and RoleBinding it
watches pods and pools with), and an HTTPRoute from a Gateway to the pool.

The endpoint picker scrapes the engines' /metrics under vLLM's metric names, which the engine
serves as aliases of its own (vllm:num_requests_waiting for tokenmill_num_requests_waiting,
...), so it runs with its defaults for a vLLM model server.
"""

from __future__ import annotations

from typing import Any

import yaml

from .args import PORT
from .manifests import (
    CONTAINER_SECURITY_CONTEXT,
    cluster_ip_service,
    image_pull_secrets,
    owned_metadata,
    selector,
)
from .spec import EPP_SUFFIX, InferenceServiceSpec

POOL_API = "inference.networking.k8s.io/v1"
ROUTE_API = "gateway.networking.k8s.io/v1"
POOL_GROUP = POOL_API.partition("/")[0]
GATEWAY_GROUP = ROUTE_API.partition("/")[0]
# The InferenceObjectives of the same release's experimental group, which the picker watches.
OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
COMPONENT = "endpoint-picker"
PICKER_LABEL = "tokenmill.io/endpoint-picker"  # the picker's pods; never the engines' label
EXT_PROC_PORT = 9002  # gRPC ext-proc, what the gateway calls
HEALTH_PORT = 9003  # gRPC health, the probes'
METRICS_PORT = 9090  # the picker's own Prometheus metrics
HEALTH_SERVICE = "inference-extension"  # the gRPC health service the picker answers for
# What the body-based router of the inference extension writes from a request's `model`.
MODEL_HEADER = "X-Gateway-Model-Name"
# The picker's scheduling: score every pod by its queue, its KV-cache use and how much of the
# request's prefix it likely holds, and take the best (its own default profile).
SCORERS = (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3))
PICKER_POD_SECURITY_CONTEXT = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def picker_name(name: str) -> str:
    return f"{name}{EPP_SUFFIX}"


def picker_selector(name: str) -> dict[str, str]:
    """The picker's pods: not the engines' selector, so neither the engine Service, the PDB
    nor the pool selects them."""
    return {PICKER_LABEL: name}


def picker_config(flow_control: bool) -> str:
    """The picker's EndpointPickerConfig (its --config-text)."""
    config: dict[str, Any] = {
        "apiVersion": f"{OBJECTIVE_GROUP}/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": scorer} for scorer, _ in SCORERS],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": scorer, "weight": weight} for scorer, weight in SCORERS]}],
    }
    if flow_control:
        config["featureGates"] = ["flowControl"]
    return yaml.safe_dump(config, sort_keys=False)


def inference_pool(name: str, namespace: str, uid: str,
                   spec: InferenceServiceSpec) -> dict[str, Any]:
    """The pool of the engine pods, on the engines' port, picked by the endpoint picker."""
    pool = spec.inference_pool
    assert pool is not None
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": owned_metadata(name, namespace, uid, component=COMPONENT),
        "spec": {
            "selector": {"matchLabels": selector(name)},
            "targetPorts": [{"number": PORT}],
            "endpointPickerRef": {
                "name": picker_name(name),
                "port": {"number": EXT_PROC_PORT},
                "failureMode": pool.endpoint_picker.failure_mode,
            },
        },
    }


def _picker_metadata(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return owned_metadata(name, namespace, uid, picker_name(name), COMPONENT)


def picker_service_account(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _picker_metadata(name, namespace, uid)}


def picker_rules() -> list[dict[str, Any]]:
    """What the picker reads in its namespace: the engine pods, its pool, the objectives."""
    read = ["get", "list", "watch"]
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
            {"apiGroups": [OBJECTIVE_GROUP], "resources": ["inferenceobjectives"], "verbs": read}]


def picker_role(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _picker_metadata(name, namespace, uid), "rules": picker_rules()}


def picker_role_binding(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _picker_metadata(name, namespace, uid),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": picker_name(name)},
        "subjects": [{"kind": "ServiceAccount", "name": picker_name(name),
                      "namespace": namespace}],
    }


def _grpc_probe(period: int, failures: int) -> dict[str, Any]:
    return {"grpc": {"port": HEALTH_PORT, "service": HEALTH_SERVICE}, "initialDelaySeconds": 5,
            "periodSeconds": period, "failureThreshold": failures}


def picker_deployment(name: str, namespace: str, uid: str,
                      spec: InferenceServiceSpec) -> dict[str, Any]:
    """The endpoint picker: it watches the pool and its pods in this namespace and answers the
    gateway's ext-proc calls with the pod to send each request to."""
    pool = spec.inference_pool
    assert pool is not None
    picker = pool.endpoint_picker
    template_labels = {"app.kubernetes.io/name": "tokenmill", "app.kubernetes.io/instance": name,
                       "app.kubernetes.io/component": COMPONENT, **picker_selector(name)}
    container = {
        "name": "epp",
        "image": picker.image,
        "args": ["--pool-name", name, "--pool-namespace", namespace,
                 "--pool-group", POOL_GROUP, "--config-text", picker_config(picker.flow_control)],
        "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": _grpc_probe(10, 3),
        "readinessProbe": _grpc_probe(5, 2),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
    }
    pod = {"serviceAccountName": picker_name(name),
           "securityContext": PICKER_POD_SECURITY_CONTEXT, "containers": [container]}
    if secrets := image_pull_secrets(spec):  # a mirror of the picker's image may need them
        pod["imagePullSecrets"] = secrets
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _picker_metadata(name, namespace, uid),
        "spec": {
            "replicas": picker.replicas,
            "selector": {"matchLabels": picker_selector(name)},
            "template": {
                "metadata": {"labels": template_labels},
                "spec": pod,
            },
        },
    }


def picker_service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    """What the pool's endpointPickerRef names: the ext-proc port (HTTP/2) and the metrics."""
    return cluster_ip_service(
        _picker_metadata(name, namespace, uid), picker_selector(name),
        [{"name": "grpc-ext-proc", "port": EXT_PROC_PORT, "targetPort": "grpc",
          "protocol": "TCP", "appProtocol": "http2"},
         {"name": "http-metrics", "port": METRICS_PORT, "targetPort": "metrics",
          "protocol": "TCP"}])


def _matches(spec: InferenceServiceSpec, name: str) -> list[dict[str, Any]]:
    """Every request (path /), or with gateway.matchModelName the requests whose model (the
    served name or an adapter's) the body-based router put in MODEL_HEADER."""
    pool = spec.inference_pool
    assert pool is not None and pool.gateway is not None
    prefix = {"path": {"type": "PathPrefix", "value": "/"}}
    if not pool.gateway.match_model_name:
        return [prefix]
    models = [spec.model.served_name or name, *(a.name for a in spec.adapters)]
    return [{**prefix, "headers": [{"type": "Exact", "name": MODEL_HEADER, "value": model}]}
            for model in models]


def http_route(name: str, namespace: str, uid: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    """The Gateway's route to the pool."""
    pool = spec.inference_pool
    assert pool is not None and pool.gateway is not None
    parent = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": pool.gateway.name}
    if pool.gateway.namespace:
        parent["namespace"] = pool.gateway.namespace
    rule: dict[str, Any] = {"matches": _matches(spec, name),
                            "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool",
                                             "name": name}]}
    if pool.gateway.request_timeout:
        rule["timeouts"] = {"request": pool.gateway.request_timeout}
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": owned_metadata(name, namespace, uid, component=COMPONENT),
        "spec": {
            "parentRefs": [parent],
            "rules": [rule],
        },
    }


def children(name: str, namespace: str, uid: str,
             spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The routing objects the spec asks for, in the order they are written: the picker's
    identity and permissions before the picker, the pool before the route that names it."""
    pool = spec.inference_pool
    if pool is None:
        return []
    objects = [picker_service_account(name, namespace, uid), picker_role(name, namespace, uid),
               picker_role_binding(name, namespace, uid),
               picker_deployment(name, namespace, uid, spec), picker_service(name, namespace, uid),
               inference_pool(name, namespace, uid, spec)]
    if pool.gateway is not None:
        objects.append(http_route(name, namespace, uid, spec))
    return objects


# Every kind routing may have written, by (apiVersion, kind, name suffix): what is deleted when
# routing.inferencePool goes.
KINDS = (("v1", "ServiceAccount", EPP_SUFFIX),
         ("rbac.authorization.k8s.io/v1", "Role", EPP_SUFFIX),
         ("rbac.authorization.k8s.io/v1", "RoleBinding", EPP_SUFFIX),
         ("apps/v1", "Deployment", EPP_SUFFIX), ("v1", "Service", EPP_SUFFIX),
         (POOL_API, "InferencePool", ""), (ROUTE_API, "HTTPRoute", ""))
