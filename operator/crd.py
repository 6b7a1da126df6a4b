"""Generate the InferenceService CRD from the pydantic models in spec.py.

Regenerate the checked-in copies after changing spec.py (-P keeps the repository's `operator/`
directory from shadowing Python's `operator` module):

    python -P -m tokenmill.operator.crd crds/inferenceservices.tokenmill.io.yaml \
        charts/tokenmill/crds/inferenceservices.tokenmill.io.yaml
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from .spec import (
    DNS_LABEL_PATTERN,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    InferenceServiceSpec,
    InferenceServiceStatus,
    routed_name_rule,
    served_name_rule,
)

NAME = f"{PLURAL}.{GROUP}"
FILENAME = f"{NAME}.yaml"
_KEEP = {"type", "description", "default", "enum", "minimum", "maximum", "exclusiveMinimum",
         "exclusiveMaximum", "pattern", "format", "items", "properties", "required",
         "additionalProperties", "minLength", "maxLength", "minItems", "maxItems",
         "maxProperties"}

# Fields typed by a Kubernetes API definition take its schema from the Kubernetes release below,
# as kubernetes-validate ships it (a development dependency: only generating the CRD needs it).
KUBERNETES_SCHEMA_VERSION = "1.31.0"
# Values the Kubernetes API validates in code rather than in its OpenAPI schema.
KUBERNETES_ENUMS = {
    ("io.k8s.api.core.v1.Toleration", "operator"): ["Equal", "Exists"],
    ("io.k8s.api.core.v1.Toleration", "effect"): ["", "NoSchedule", "PreferNoSchedule",
                                                  "NoExecute"],
    ("io.k8s.api.core.v1.NodeSelectorRequirement", "operator"): [
        "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
    ("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement", "operator"): [
        "In", "NotIn", "Exists", "DoesNotExist"],
    ("io.k8s.api.core.v1.TopologySpreadConstraint", "whenUnsatisfiable"): [
        "DoNotSchedule", "ScheduleAnyway"],
    ("io.k8s.api.core.v1.TopologySpreadConstraint", "nodeAffinityPolicy"): ["Honor", "Ignore"],
    ("io.k8s.api.core.v1.TopologySpreadConstraint", "nodeTaintsPolicy"): ["Honor", "Ignore"],
    ("io.k8s.api.core.v1.VolumeMount", "mountPropagation"): [
        "None", "HostToContainer", "Bidirectional"],
    ("io.k8s.api.core.v1.VolumeMount", "recursiveReadOnly"): ["Disabled", "IfPossible",
                                                              "Enabled"],
}
# Bounds the Kubernetes API enforces in code (a volume's name is a DNS label; a path longer
# than Linux's PATH_MAX cannot be mounted), written into the schema so that the CEL rules over
# these strings are costed as the short strings they are.
KUBERNETES_BOUNDS = {
    ("io.k8s.api.core.v1.Volume", "name"): {"maxLength": 63},
    ("io.k8s.api.core.v1.VolumeMount", "name"): {"maxLength": 63},
    ("io.k8s.api.core.v1.VolumeMount", "mountPath"): {"maxLength": 4096},
}
_KUBERNETES_KEEP = {"type", "format", "items", "properties", "required", "additionalProperties",
                    "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
                    "x-kubernetes-map-type"}


@functools.cache
def _kubernetes_definitions() -> dict[str, Any]:
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = root / f"v{KUBERNETES_SCHEMA_VERSION}-local-strict" / "_definitions.json"
    return json.loads(path.read_text())["$defs"]


def kubernetes_schema(name: str) -> dict[str, Any]:
    """A Kubernetes API definition as a structural schema: refs inlined, nullable types made
    plain, quantities int-or-string, unknown fields pruned. Only the definition's own fields
    keep a description, their first sentence, for `kubectl explain`: all of them would make the
    CRD too large for kubectl's client-side apply annotation."""
    defs = _kubernetes_definitions()

    def convert(node: dict[str, Any], definition: str = "", depth: int = 0) -> dict[str, Any]:
        if "$ref" in node:
            target = node["$ref"].rsplit("/", 1)[1]
            return convert(defs[target], target, depth)
        if "oneOf" in node:  # Quantity and IntOrString: a string or a number
            return {"x-kubernetes-int-or-string": True}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key not in _KUBERNETES_KEEP or (key == "additionalProperties" and value is False):
                continue
            if key == "type":
                (value,) = [t for t in ([value] if isinstance(value, str) else value)
                            if t != "null"]
            elif key == "properties":
                value = {prop: {**(_first_sentence(sub) if depth == 0 else {}),
                                **convert(sub, depth=depth + 1), **(
                    {"enum": KUBERNETES_ENUMS[definition, prop]}
                    if (definition, prop) in KUBERNETES_ENUMS else {}),
                                **KUBERNETES_BOUNDS.get((definition, prop), {})}
                    for prop, sub in value.items()}
            elif key in ("items", "additionalProperties"):
                value = convert(value, depth=depth)
            out[key] = value
        return out

    return convert(defs[name], name)


def _first_sentence(node: dict[str, Any]) -> dict[str, str]:
    """{"description": its first sentence} of a node that has one (else {})."""
    text = " ".join(str(node.get("description", "")).split())
    if not text:
        return {}
    end = text.find(". ")
    return {"description": text if end < 0 else text[:end + 1]}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """A pydantic JSON Schema node as a Kubernetes structural schema: refs inlined, optional
    types collapsed, numeric exclusive bounds in OpenAPI v3.0 form, free-form objects kept."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "x-tokenmill-kubernetes-type" in node:
        typed = kubernetes_schema(node["x-tokenmill-kubernetes-type"])
        rest = {k: v for k, v in node.items() if k not in ("x-tokenmill-kubernetes-type", "type")}
        return {**typed, **_structural(rest, defs)}
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        return _structural({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    if "anyOf" in node:  # `X | None`: the null branch is how the field is left out
        (inner,) = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _structural({**inner, **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            out[key] = value
        elif key == "properties":
            out[key] = {name: _structural(v, defs) for name, v in value.items()}
        elif key == "additionalProperties" and value is False:
            continue  # implied: the API server prunes unknown fields
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "description":
            out[key] = " ".join(value.split())
        elif key == "default" and value is None or key not in _KEEP:
            continue
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and (
        out.get("additionalProperties") in (None, True)
    ):  # a free-form Kubernetes object (affinity, tolerations, valueFrom)
        out.pop("additionalProperties", None)
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and out.get("properties") == {}:
        out.pop("properties")
    first = [k for k in ("type", "description") if k in out]
    return {k: out[k] for k in [*first, *sorted(set(out) - set(first))]}


def schema(model: type) -> dict[str, Any]:
    """The structural OpenAPI schema of one pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    spec_schema = schema(InferenceServiceSpec)
    status_schema = schema(InferenceServiceStatus)
    ready = '.status.conditions[?(@.type=="Ready")]'
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": KIND.lower(),
                      "listKind": f"{KIND}List", "shortNames": ["tmis"],
                      "categories": ["tokenmill"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": spec_schema["description"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {**spec_schema, "default": {}},
                        "status": status_schema,
                    },
                    "x-kubernetes-validations": [{
                        "rule": "size(self.metadata.name) <= 63",
                        "message": "metadata.name must be at most 63 characters: it names the "
                                   "Service",
                    }, {
                        "rule": f"self.metadata.name.matches('{DNS_LABEL_PATTERN}')",
                        "message": "metadata.name must be a DNS label (lower-case letters, "
                                   "digits and '-', starting with a letter): it names the "
                                   "Service",
                    }, served_name_rule(), routed_name_rule()],
                }},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas",
                              "statusReplicasPath": ".status.replicas",
                              "labelSelectorPath": ".status.selector"},
                },
                "additionalPrinterColumns": [
                    {"name": "Model", "type": "string", "jsonPath": ".spec.model.uri"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
                    {"name": "Ready", "type": "string", "jsonPath": f"{ready}.status"},
                    {"name": "Reason", "type": "string", "jsonPath": f"{ready}.reason"},
                    {"name": "URL", "type": "string", "jsonPath": ".status.url"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    {"name": "Message", "type": "string", "jsonPath": f"{ready}.message",
                     "priority": 1},  # kubectl get -o wide
                ],
            }],
        },
    }


def render() -> str:
    """The CRD as the YAML checked in under crds/."""
    header = "# Generated from operator/spec.py by tokenmill.operator.crd; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    for target in args:
        Path(target).write_text(render())
    if not args:
        sys.stdout.write(render())


if __name__ == "__main__":
    main()
