"""What an older kube-apiserver does with Deployment fields newer than itself.

A built-in object is decoded into the server's Go types. A field those types lack is dropped;
with the request's fieldValidation unset the server uses Warn (apiserver
pkg/endpoints/handlers/rest.go, fieldValidation: "" -> Warn), so the write succeeds and the
response carries one `Warning: 299 - "unknown field \\"<path>\\""` header per field
(sigs.k8s.io/json strict decoding names the full path, e.g.
`spec.template.spec.containers[0].securityContext.appArmorProfile`; the header is
apimachinery util/net NewWarningHeader: code, agent "-", the text quoted with `"` and `\\`
escaped). kubectl create/apply send fieldValidation=Strict and are refused instead; the
Python client sends nothing, hence Warn.

A field the types have but whose feature gate is off by default is dropped silently by the
registry strategy (dropDisabledFields): no warning at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POD = ("spec", "template", "spec")
AFFINITY_TERMS = [
    (*POD, "affinity", kind, "requiredDuringSchedulingIgnoredDuringExecution", "*")
    for kind in ("podAffinity", "podAntiAffinity")
] + [
    (*POD, "affinity", kind, "preferredDuringSchedulingIgnoredDuringExecution", "*",
     "podAffinityTerm")
    for kind in ("podAffinity", "podAntiAffinity")
]


@dataclass(frozen=True)
class VersionedField:
    """A Deployment field by path ("*" is every list item), the minor version whose types have
    it and the first minor version that keeps it by default."""

    path: tuple[str, ...]
    known: int
    kept: int


FIELDS = [
    # KEP-24: AppArmor fields, added in 1.30 with the AppArmor gate on (beta), GA in 1.31.
    VersionedField((*POD, "securityContext", "appArmorProfile"), 30, 30),
    VersionedField((*POD, "containers", "*", "securityContext", "appArmorProfile"), 30, 30),
    # KEP-3633: matchLabelKeys / mismatchLabelKeys of PodAffinityTerm, alpha in 1.29 (gate
    # MatchLabelKeysInPodAffinity off), beta and on by default in 1.31.
    *[VersionedField((*term, key), 29, 31) for term in AFFINITY_TERMS
      for key in ("matchLabelKeys", "mismatchLabelKeys")],
    # KEP-3857: a mount's recursiveReadOnly, alpha in 1.30 (gate RecursiveReadOnlyMounts off),
    # beta and on by default in 1.31.
    VersionedField((*POD, "containers", "*", "volumeMounts", "*", "recursiveReadOnly"), 30, 31),
]


def _matches(value: Any, path: tuple[str, ...], where: str) -> list[tuple[Any, str, str]]:
    """(parent dict, key, path as the server writes it) for each place `path` names."""
    head, rest = path[0], path[1:]
    if head == "*":
        if not isinstance(value, list):
            return []
        return [m for i, item in enumerate(value) for m in _matches(item, rest, f"{where}[{i}]")]
    if not isinstance(value, dict) or head not in value:
        return []
    here = f"{where}.{head}" if where else head
    if not rest:
        return [(value, head, here)]
    return _matches(value[head], rest, here)


def drop_unknown(obj: dict[str, Any], minor: int) -> list[str]:
    """Remove from a Deployment what a 1.`minor` server does not keep; the warnings it sends."""
    warnings = []
    for field in FIELDS:
        if minor >= field.kept:
            continue
        for parent, key, where in _matches(obj, field.path, ""):
            del parent[key]
            if minor < field.known:
                warnings.append(f'unknown field "{where}"')
    return warnings


def warning_header(text: str) -> str:
    """One Warning header value, as the API server writes it."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{quoted}"'
