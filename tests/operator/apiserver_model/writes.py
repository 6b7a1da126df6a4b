"""What the API server does to every object written to it, whatever the resource: quantities of
built-in types stored canonically (quantity.py), empty optional strings and lists of a pod spec
left out, a pod's volumes defaulted, the total size of metadata.annotations capped, and an
Event's text within its limits.

Empty values: the core/v1 types tag their optional string and slice fields `omitempty`, so an
empty one is stored and read back as no key at all (`env: [{name: X, value: ""}]` comes back as
`[{name: X}]`). Pointer fields (`*bool` such as allowPrivilegeEscalation) keep `false`, and
non-pointer structs (`resources: {}`) are never omitted, so only "" and [] are modelled.

The size rule is k8s.io/apimachinery/pkg/api/validation/objectmeta.go: ValidateAnnotationsSize
counts len(key) + len(value) in bytes over every annotation and refuses more than
TotalAnnotationSizeLimitB (256 KiB) with field.TooLong on metadata.annotations; the pod template
of a workload is ObjectMeta too (ValidatePodTemplateSpec), so the same rule holds for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .quantity import canonical

ANNOTATIONS_LIMIT = 256 * (1 << 10)  # TotalAnnotationSizeLimitB
TOO_LONG = f"Too long: must have at most {ANNOTATIONS_LIMIT} bytes"  # field.TooLong's detail
WORKLOADS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job")


def _pod_specs(kind: str, obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "Pod":
        yield spec
    elif kind in WORKLOADS and isinstance(spec.get("template"), dict):
        pod = spec["template"].get("spec")
        if isinstance(pod, dict):
            yield pod


def _canonical_map(values: Any) -> None:
    if isinstance(values, dict):
        for name, value in values.items():
            if value is not None:  # a merge patch's null deletes the entry
                values[name] = canonical(value)


def canonicalize(kind: str, obj: dict[str, Any]) -> None:
    """Rewrite in place the quantities of a Pod or a workload's pod template: container (and
    init container) requests and limits, an env variable's resourceFieldRef divisor, emptyDir
    sizeLimit. Works on a whole object or on a
    merge patch (lists are replaced whole, so a patched container list is complete)."""
    for pod in _pod_specs(kind, obj):
        for key in ("containers", "initContainers"):
            for container in pod.get(key) or []:
                resources = container.get("resources") if isinstance(container, dict) else None
                for part in ("requests", "limits"):
                    _canonical_map((resources or {}).get(part))
                for variable in (container.get("env") or []) if isinstance(container, dict) else []:
                    field = ((variable or {}).get("valueFrom") or {}).get("resourceFieldRef")
                    if isinstance(field, dict) and field.get("divisor") is not None:
                        field["divisor"] = canonical(field["divisor"])
        for volume in pod.get("volumes") or []:
            empty_dir = volume.get("emptyDir") if isinstance(volume, dict) else None
            if isinstance(empty_dir, dict) and empty_dir.get("sizeLimit") is not None:
                empty_dir["sizeLimit"] = canonical(empty_dir["sizeLimit"])


# pkg/apis/core/v1/defaults.go: the mode of a volume's files when its source names none (0644).
DEFAULT_FILE_MODE = 0o644
_MODE_DEFAULTED = ("secret", "configMap", "projected", "downwardAPI")


def default_volumes(kind: str, obj: dict[str, Any]) -> None:
    """Write in place the defaults the API server gives a pod's volumes: a volume naming no
    source is an emptyDir (SetDefaults_Volume); secret, configMap, projected and downwardAPI
    sources get defaultMode 0644 (their SetDefaults_*). A merge patch replaces the list whole,
    so the same holds for a patch."""
    for pod in _pod_specs(kind, obj):
        for volume in pod.get("volumes") or []:
            if not isinstance(volume, dict):
                continue
            if set(volume) <= {"name"}:
                volume["emptyDir"] = {}
            for source in _MODE_DEFAULTED:
                if isinstance(volume.get(source), dict):
                    volume[source].setdefault("defaultMode", DEFAULT_FILE_MODE)


def _omit_empty(value: Any, patch: bool) -> Any:
    """`value` with its empty strings and lists gone; in a merge patch they become null, which
    leaves the key absent after the write just as the server's encoder does."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if item == "" or item == []:
                if patch:
                    out[key] = None
                continue
            out[key] = _omit_empty(item, patch)
        return out
    if isinstance(value, list):
        return [_omit_empty(item, patch) for item in value]
    return value


def omit_empty(kind: str, obj: dict[str, Any], patch: bool = False) -> None:
    """Drop, in place, the empty optional strings and lists of a Pod's or a workload's pod
    spec, as the API server stores them (see the module's docstring)."""
    for pod in _pod_specs(kind, obj):
        cleaned = _omit_empty(pod, patch)
        pod.clear()
        pod.update(cleaned)


def annotation_bytes(annotations: dict[str, str] | None) -> int:
    """Bytes of keys and values, as ValidateAnnotationsSize counts them."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in (annotations or {}).items())


def merge_patch(target: Any, patch: Any) -> Any:
    """The object after a JSON merge patch (RFC 7386): what the server validates."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def too_long(kind: str, obj: dict[str, Any]) -> list[str]:
    """The fields whose annotations exceed the limit, as the API server names them."""
    fields = []
    if annotation_bytes((obj.get("metadata") or {}).get("annotations")) > ANNOTATIONS_LIMIT:
        fields.append("metadata.annotations")
    template = (obj.get("spec") or {}).get("template") if kind in WORKLOADS else None
    meta = (template or {}).get("metadata") or {}
    if annotation_bytes(meta.get("annotations")) > ANNOTATIONS_LIMIT:
        fields.append("spec.template.metadata.annotations")
    return fields


# k8s.io/kubernetes pkg/apis/core/validation/events.go, legacyValidateEvent: an Event with
# eventTime set (kopf sets it) is held to the events.k8s.io limits, in bytes (Go's len).
EVENT_LIMITS = {"message": 1024, "reason": 128, "action": 128, "reportingInstance": 128}


def event_errors(event: dict[str, Any]) -> list[str]:
    """The fields of an Event written with eventTime that are longer than the server takes."""
    if not event.get("eventTime"):
        return []
    return [f"{field}: can have at most {limit} characters" for field, limit in
            EVENT_LIMITS.items() if len(str(event.get(field) or "").encode()) > limit]
