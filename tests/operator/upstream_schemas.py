"""The schemas of the custom resources the operator writes for routing and KEDA, written here
from their projects' published API documentation (JSON Schema, draft 7, with the rules their
CRDs hold as CEL or their admission webhooks check written as functions), so a generated
object is checked the way the API server (and the project's webhook) would check it:

- InferencePool, inference.networking.k8s.io/v1: the Gateway API inference extension's API
  reference (v1.0, https://gateway-api-inference-extension.sigs.k8s.io/reference/spec/):
  InferencePoolSpec {selector.matchLabels (required, at most 64, label keys and values),
  targetPorts (required, exactly one {number 1..65535}), endpointPickerRef (required: name;
  group (default ""), kind (default Service), port {number} required when kind is Service,
  failureMode FailOpen|FailClose (default FailClose))}.
- HTTPRoute, gateway.networking.k8s.io/v1: the Gateway API reference (v1.x): parentRefs
  (at most 32: group, kind, namespace, name, sectionName, port), hostnames, rules (at most 16:
  matches (at most 64: path {type Exact|PathPrefix|RegularExpression, value}, headers (at most
  16: type Exact|RegularExpression, name, value), queryParams, method), filters, backendRefs
  (at most 16: group, kind, name, namespace, port, weight 0..1000000, filters), timeouts,
  name). A backendRef to a core Service needs a port; one to an InferencePool (group
  inference.networking.k8s.io) does not (the inference extension's HTTPRoute guide).
- ScaledObject, keda.sh/v1alpha1: KEDA's ScaledObject specification (2.x,
  https://keda.sh/docs/latest/reference/scaledobject-spec/): scaleTargetRef {apiVersion, kind,
  name (required), envSourceContainerName}, pollingInterval, cooldownPeriod,
  initialCooldownPeriod, idleReplicaCount, minReplicaCount, maxReplicaCount, fallback
  {failureThreshold, replicas}, advanced {restoreToOriginalReplicaCount,
  horizontalPodAutoscalerConfig {name, behavior (Kubernetes HPA behavior)}, scalingModifiers},
  triggers (required: type (required), name, metadata (required, strings), authenticationRef,
  metricType AverageValue|Value|Utilization, useCachedMetrics); the webhook refuses
  minReplicaCount above maxReplicaCount and an idleReplicaCount not below minReplicaCount. The
  Prometheus scaler's metadata: serverAddress, query and threshold required, activationThreshold
  optional (https://keda.sh/docs/latest/scalers/prometheus/).
"""

from __future__ import annotations

from typing import Any

import jsonschema

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
GROUP = {"type": "string", "maxLength": 253, "pattern": r"^$|" + DNS_SUBDOMAIN}
KIND = {"type": "string", "minLength": 1, "maxLength": 63,
        "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"}
OBJECT_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
NAMESPACE = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": DNS_LABEL}
PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
LABEL_VALUE = {"type": "string", "maxLength": 63,
               "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A closed object: a field the API does not have is refused (the API server prunes or,
    with strict field validation, refuses it)."""
    node: dict[str, Any] = {"type": "object", "properties": properties,
                            "additionalProperties": False}
    if required:
        node["required"] = list(required)
    return node


def _list(item: dict[str, Any], most: int | None = None, least: int = 0) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "array", "items": item}
    if most is not None:
        node["maxItems"] = most
    if least:
        node["minItems"] = least
    return node


METADATA = {"type": "object", "required": ["name", "namespace"], "properties": {
    "name": {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN},
    "namespace": NAMESPACE,
    "labels": {"type": "object", "additionalProperties": LABEL_VALUE,
               "propertyNames": {"pattern": LABEL_KEY, "maxLength": 317}},
    "ownerReferences": _list(_object({
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "name": {"type": "string"}, "uid": {"type": "string"},
        "controller": {"type": "boolean"}, "blockOwnerDeletion": {"type": "boolean"}},
        ("apiVersion", "kind", "name", "uid"))),
}}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"enum": [api_version]}, "kind": {"enum": [kind]},
                           "metadata": METADATA, "spec": spec, "status": {"type": "object"}},
            "additionalProperties": False}


INFERENCE_POOL = _resource("inference.networking.k8s.io/v1", "InferencePool", _object({
    "selector": _object({"matchLabels": {
        "type": "object", "maxProperties": 64, "minProperties": 1,
        "additionalProperties": LABEL_VALUE,
        "propertyNames": {"pattern": LABEL_KEY, "minLength": 1, "maxLength": 253}}},
        ("matchLabels",)),
    "targetPorts": _list(_object({"number": PORT_NUMBER}, ("number",)), most=1, least=1),
    "endpointPickerRef": _object({
        "group": GROUP, "kind": KIND, "name": OBJECT_NAME,
        "port": _object({"number": PORT_NUMBER}, ("number",)),
        "failureMode": {"enum": ["FailOpen", "FailClose"]}}, ("name",)),
}, ("selector", "targetPorts", "endpointPickerRef")))

PARENT_REF = _object({"group": GROUP, "kind": KIND, "namespace": NAMESPACE,
                      "name": OBJECT_NAME, "sectionName": {"type": "string", "maxLength": 253},
                      "port": PORT_NUMBER}, ("name",))
HTTP_MATCH = _object({
    "path": _object({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                     "value": {"type": "string", "maxLength": 1024}}),
    "headers": _list(_object({"type": {"enum": ["Exact", "RegularExpression"]},
                              "name": {"type": "string", "minLength": 1, "maxLength": 256,
                                       "pattern": r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$"},
                              "value": {"type": "string", "minLength": 1, "maxLength": 4096}},
                             ("name", "value")), most=16),
    "queryParams": _list({"type": "object"}, most=16),
    "method": {"enum": ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE",
                        "PATCH"]},
})
BACKEND_REF = _object({"group": GROUP, "kind": KIND, "name": OBJECT_NAME,
                       "namespace": NAMESPACE, "port": PORT_NUMBER,
                       "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
                       "filters": _list({"type": "object"}, most=16)}, ("name",))
DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
HTTP_ROUTE = _resource("gateway.networking.k8s.io/v1", "HTTPRoute", _object({
    "parentRefs": _list(PARENT_REF, most=32),
    "hostnames": _list({"type": "string", "maxLength": 253}, most=16),
    "rules": _list(_object({
        "name": {"type": "string", "maxLength": 253},
        "matches": _list(HTTP_MATCH, most=64),
        "filters": _list({"type": "object"}, most=16),
        "backendRefs": _list(BACKEND_REF, most=16),
        "timeouts": _object({"request": DURATION, "backendRequest": DURATION}),
    }), most=16),
}))

COUNT = {"type": "integer", "minimum": 0, "maximum": 2147483647}
SCALING_RULES = _object({
    "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
    "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
    "policies": _list(_object({"type": {"enum": ["Pods", "Percent"]},
                               "value": {"type": "integer", "minimum": 1},
                               "periodSeconds": {"type": "integer", "minimum": 1,
                                                 "maximum": 1800}},
                              ("type", "value", "periodSeconds"))),
})
SCALED_OBJECT = _resource("keda.sh/v1alpha1", "ScaledObject", _object({
    "scaleTargetRef": _object({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                               "name": {"type": "string", "minLength": 1},
                               "envSourceContainerName": {"type": "string"}}, ("name",)),
    "pollingInterval": COUNT, "cooldownPeriod": COUNT, "initialCooldownPeriod": COUNT,
    "idleReplicaCount": COUNT, "minReplicaCount": COUNT, "maxReplicaCount": COUNT,
    "fallback": _object({"failureThreshold": COUNT, "replicas": COUNT},
                        ("failureThreshold", "replicas")),
    "advanced": _object({
        "restoreToOriginalReplicaCount": {"type": "boolean"},
        "horizontalPodAutoscalerConfig": _object({
            "name": {"type": "string"},
            "behavior": _object({"scaleUp": SCALING_RULES, "scaleDown": SCALING_RULES})}),
        "scalingModifiers": {"type": "object"},
    }),
    "triggers": _list(_object({
        "type": {"type": "string", "minLength": 1},
        "name": {"type": "string"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "authenticationRef": _object({"name": {"type": "string"}, "kind": {"type": "string"}},
                                     ("name",)),
        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
        "useCachedMetrics": {"type": "boolean"},
    }, ("type", "metadata")), least=1),
}, ("scaleTargetRef", "triggers")))
PROMETHEUS_METADATA = ("serverAddress", "query", "threshold")  # the scaler's required keys

SCHEMAS = {("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
           ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
           ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT}


def _rules(obj: dict[str, Any]) -> list[str]:
    """The cross-field rules: the CRDs' CEL and KEDA's admission webhook."""
    spec, kind = obj.get("spec") or {}, obj.get("kind")
    errors = []
    if kind == "InferencePool":
        ref = spec.get("endpointPickerRef") or {}
        if ref.get("kind", "Service") == "Service" and "port" not in ref:
            errors.append("spec.endpointPickerRef: port is required when kind is 'Service'")
    if kind == "HTTPRoute":
        for i, rule in enumerate(spec.get("rules") or []):
            for j, ref in enumerate(rule.get("backendRefs") or []):
                core = ref.get("group", "") == "" and ref.get("kind", "Service") == "Service"
                if core and "port" not in ref:
                    errors.append(f"spec.rules[{i}].backendRefs[{j}]: Must have port for "
                                  "Service reference")
    if kind == "ScaledObject":
        low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if low > high:
            errors.append(f"MinReplicaCount={low} must be less than MaxReplicaCount={high}")
        if "idleReplicaCount" in spec and spec["idleReplicaCount"] >= low:
            errors.append("IdleReplicaCount must be less than MinReplicaCount")
        for i, trigger in enumerate(spec.get("triggers") or []):
            if trigger.get("type") == "prometheus":
                for key in PROMETHEUS_METADATA:
                    if not (trigger.get("metadata") or {}).get(key):
                        errors.append(f"spec.triggers[{i}].metadata: no {key} given")
    return errors


def errors(obj: dict[str, Any]) -> list[str]:
    """What the API server (and, for a ScaledObject, KEDA's webhook) would say to `obj`."""
    schema = SCHEMAS[(obj.get("apiVersion"), obj.get("kind"))]
    found = [f"{'.'.join(map(str, e.path))}: {e.message}"
             for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    return found + _rules(obj)
