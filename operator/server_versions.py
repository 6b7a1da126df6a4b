"""Spec fields that need a newer Kubernetes than the oldest one the operator supports.

The CRD inlines Kubernetes 1.31's schemas, so an older API server admits these fields in an
InferenceService and then drops them from the Deployment (a field its types lack: a `299`
warning; a field behind a feature gate that is off: nothing). The general answer is in
reconcile.py: what the server did not keep is reported (FieldsDropped) and not written again
until the spec changes. Fields listed here are refused instead, below the version that keeps
them, because running without them weakens the pods' security without anyone asking for it.
"""

from __future__ import annotations

from .spec import InferenceServiceSpec, SpecError

MINIMUM = (1, 28)  # the oldest API server the operator is tried against; the chart's kubeVersion
# (spec field, its key) -> the first Kubernetes (major, minor) that keeps it: AppArmor profiles
# are fields from 1.30 (KEP-24); older servers drop them and the pods run unconfined. A mount's
# recursiveReadOnly is gated off before 1.31 (KEP-3857): dropped, the submounts of a read-only
# mount stay writable.
REFUSED_BELOW = {
    ("podSecurityContext", "appArmorProfile"): (1, 30),
    ("containerSecurityContext", "appArmorProfile"): (1, 30),
    ("volumeMounts[]", "recursiveReadOnly"): (1, 31),
}


def _set_at(spec: InferenceServiceSpec, field: str, key: str) -> str | None:
    """Where the spec sets `key` of `field` (`spec.volumeMounts[1].recursiveReadOnly`), or None."""
    values = {"podSecurityContext": [spec.pod_security_context],
              "containerSecurityContext": [spec.container_security_context],
              "volumeMounts[]": spec.volume_mounts}[field]
    for i, value in enumerate(values):
        if key in (value or {}):
            return f"spec.{field.replace('[]', f'[{i}]')}.{key}"
    return None


def check_server(spec: InferenceServiceSpec, version: tuple[int, int] | None) -> None:
    """SpecError for a field the API server would drop where dropping it weakens security;
    nothing while the version is unknown (the general report of dropped fields still works)."""
    if version is None:
        return
    for (field, key), needed in REFUSED_BELOW.items():
        if version < needed and (where := _set_at(spec, field, key)):
            raise SpecError(
                f"{where}: needs Kubernetes v{needed[0]}.{needed[1]} or later; this "
                f"API server is v{version[0]}.{version[1]} and would drop the field, running the "
                "pods without it. Remove it, or upgrade the cluster")
