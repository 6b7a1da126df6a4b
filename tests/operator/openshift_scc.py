"""OpenShift's `restricted-v2` security context constraint, its rules on user and group ids.

A stand-in for a namespace of an OpenShift cluster (none runs here), from OpenShift's
documentation of the default SCCs: `runAsUser` is MustRunAsRange and `fsGroup` MustRunAs, both
against the ranges the namespace's annotations give (`openshift.io/sa.scc.uid-range`,
`openshift.io/sa.scc.supplemental-groups`). A pod that names an id outside them is refused
(the ReplicaSet's FailedCreate: "runAsUser: Invalid value: 1000: must be in the ranges ...");
one that names none gets the range's first. The other rules restricted-v2 shares with Pod
Security Standards `restricted` are psa_restricted.py's.
"""

from __future__ import annotations

from typing import Any

# As OpenShift annotates a new namespace: 10,000 ids from a start it picks.
UID_RANGE = range(1000680000, 1000690000)


def id_violations(pod: dict[str, Any], ids: range = UID_RANGE) -> list[str]:
    """What restricted-v2 refuses in a pod spec's user and group ids."""
    found = []
    pod_context = pod.get("securityContext") or {}
    fs_group = pod_context.get("fsGroup")
    if fs_group is not None and fs_group not in ids:
        found.append(f".spec.securityContext.fsGroup: {fs_group} is not an allowed group")
    for where, context in [(".spec.securityContext", pod_context),
                           *((f"{c['name']}.runAsUser", c.get("securityContext") or {})
                             for c in [*pod.get("initContainers", []), *pod["containers"]])]:
        user = context.get("runAsUser")
        if user is not None and user not in ids:
            found.append(f"{where}: runAsUser {user} must be in the ranges "
                         f"[{ids.start}, {ids.stop - 1}]")
    return found
