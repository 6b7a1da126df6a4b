"""InferenceService status from what the operator sees: the spec's validity, the Deployment and
why its pods are not ready (pods.py).

A pure function, so every condition a user can meet is tested without a cluster. Conditions
keep their lastTransitionTime until their status actually changes.
"""

from __future__ import annotations

from typing import Any

from .cluster_domain import cluster_domain
from .manifests import url
from .pod_layout import OWNER_LABEL
from .pods import needs_action


def condition(type_: str, ok: bool, reason: str, message: str) -> dict[str, str]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason,
            "message": message}


_condition = condition
# The conditions of the optional features (routing.inferencePool, autoscaling mode keda): present
# only while the feature is on.
FEATURE_CONDITIONS = ("RoutingReady", "AutoscalingReady")


def _deployment_condition(deployment: dict, type_: str) -> dict[str, Any]:
    for cond in deployment.get("status", {}).get("conditions", []):
        if cond.get("type") == type_:
            return cond
    return {}


def _rollout(deployment: dict[str, Any]) -> tuple[int, int, int, bool]:
    """(wanted, ready, available, rolled out) replicas of a Deployment, as its controller says."""
    wanted = deployment.get("spec", {}).get("replicas", 1)
    st = deployment.get("status", {})
    generation = deployment.get("metadata", {}).get("generation")
    seen = generation is None or st.get("observedGeneration", 0) >= generation
    updated, total = st.get("updatedReplicas", 0), st.get("replicas", 0)
    available = st.get("availableReplicas", 0)
    rolled_out = seen and updated >= wanted and total <= wanted and available >= wanted
    return wanted, st.get("readyReplicas", 0), available, rolled_out


def _refused(failure: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the Deployment's ReplicaFailure: the ReplicaSet controller could
    not create a pod (Pod Security, a missing ServiceAccount, quota) and says so only there and
    in an Event on the ReplicaSet. Retrying changes nothing until a person fixes the cause."""
    if failure.get("status") != "True":
        return None
    return failure.get("reason") or "ReplicaFailure", failure.get("message", "")


def conditions(deployment: dict[str, Any] | None, problem: tuple[str, str] | None,
               pod_problem: tuple[str, str] | None = None,
               notice: tuple[str, str] | None = None) -> list[dict[str, str]]:
    """Ready, Available, Progressing and Degraded, with reasons a person can act on.

    `problem` is (reason, message) when the spec cannot be deployed (e.g. InvalidSpec); it wins
    over `pod_problem`, pods.pod_problem's answer, which says why replicas are not ready.
    `notice` is a deployed spec's shortfall (FieldsDropped): Degraded when nothing worse is."""
    if deployment is None and problem:
        return [_condition("Ready", False, *problem), _condition("Available", False, *problem),
                _condition("Progressing", False, *problem), _condition("Degraded", True, *problem)]
    if deployment is None:
        ready = _condition("Ready", False, "DeploymentMissing", "the Deployment is being created")
        return [ready, _condition("Available", False, "DeploymentMissing", ready["message"]),
                _condition("Progressing", True, "Creating", ready["message"]),
                _condition("Degraded", False, "AsExpected", "")]
    wanted, ready_n, available_n, rolled_out = _rollout(deployment)
    counts = f"{ready_n}/{wanted} replicas ready"
    stuck = _deployment_condition(deployment, "Progressing")
    failure = _deployment_condition(deployment, "ReplicaFailure")
    refused = _refused(failure)

    pods_failing = None  # a pod problem a person must fix: Degraded
    if problem:
        ready = _condition("Ready", False, *problem)
    elif wanted == 0:
        ready = _condition("Ready", False, "ScaledToZero", "spec.replicas is 0")
    elif rolled_out and ready_n >= wanted:
        ready = _condition("Ready", True, "AllReplicasReady", counts)
    elif refused:
        ready = _condition("Ready", False, refused[0], f"{counts}; {refused[1]}")
    elif pod_problem:
        ready = _condition("Ready", False, pod_problem[0], f"{counts}; {pod_problem[1]}")
        pods_failing = pod_problem if needs_action(pod_problem[0]) else None
    else:
        ready = _condition("Ready", False, "RollingOut" if not rolled_out else "ReplicasNotReady",
                           counts)
    available = _condition(
        "Available", available_n > 0, "MinimumReplicasAvailable" if available_n else
        "NoReplicasAvailable", f"{available_n} replicas available")

    if stuck.get("status") == "False":
        progressing = _condition("Progressing", False, stuck.get("reason", "RolloutStuck"),
                                 stuck.get("message", ""))
    elif problem:
        progressing = _condition("Progressing", False, problem[0],
                                 "the last valid spec stays deployed")
    elif refused and not rolled_out:  # nothing moves until the cause is fixed
        progressing = _condition("Progressing", False, *refused)
    elif rolled_out:
        progressing = _condition("Progressing", False, "RolloutComplete", counts)
    else:
        progressing = _condition("Progressing", True, "RollingOut", counts)

    if problem:
        degraded = _condition("Degraded", True, *problem)
    elif pods_failing:
        degraded = _condition("Degraded", True, *pods_failing)
    elif stuck.get("status") == "False":
        degraded = _condition("Degraded", True, stuck.get("reason", "RolloutStuck"),
                              stuck.get("message", ""))
    elif refused:
        degraded = _condition("Degraded", True, *refused)
    elif notice:
        degraded = _condition("Degraded", True, *notice)
    else:
        degraded = _condition("Degraded", False, "AsExpected", "")
    return [ready, available, progressing, degraded]


LOADED, FAILED, PENDING = "Loaded", "Failed", "Pending"


def adapters(names: list[str], loaded: dict[str, frozenset[str]], ready: int,
             failures: dict[str, str]) -> list[dict[str, str]]:
    """One entry per adapter of the spec, in its order: Failed with the engine's reason when an
    engine stopped on it (that wins: a pod that cannot start needs a person even while others
    serve), Loaded when ready pods report it (`loaded`: pod -> its adapters; `ready`: how many
    pods are ready), else Pending. Messages depend only on these, so an unchanged service gets
    the same list and no write."""
    entries = []
    for name in names:
        holding = sum(name in pod for pod in loaded.values())
        if name in failures:
            entry = (FAILED, failures[name])
        elif holding:
            entry = (LOADED, f"loaded on {holding}/{ready} ready pods")
        elif ready:
            entry = (PENDING, "no ready pod reports it loaded yet")
        else:
            entry = (PENDING, "waiting for a ready engine pod")
        entries.append({"name": name, "state": entry[0], "message": entry[1]})
    return entries


def status(name: str, namespace: str, generation: int | None, deployment: dict | None,
           problem: tuple[str, str] | None, previous: dict[str, Any], now: str,
           pod_problem: tuple[str, str] | None = None,
           notice: tuple[str, str] | None = None,
           adapter_states: list[dict[str, str]] | None = None,
           features: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The whole status object; `previous` is the current status, for transition times.
    `adapter_states` (adapters()) replaces status.adapters; None leaves it as it is (a spec
    that cannot be read says nothing new about them), and an empty list removes it.
    `features` are the optional features' conditions (RoutingReady, AutoscalingReady), after
    the four; None keeps the previous ones as they are."""
    before = {c.get("type"): c for c in previous.get("conditions", [])}
    if features is None:
        features = [{k: v for k, v in c.items() if k in ("type", "status", "reason", "message")}
                    for c in previous.get("conditions", []) if c.get("type") in FEATURE_CONDITIONS]
    conds = []
    for cond in [*conditions(deployment, problem, pod_problem, notice), *features]:
        old = before.get(cond["type"], {})
        same = old.get("status") == cond["status"]
        cond["lastTransitionTime"] = old.get("lastTransitionTime", now) if same else now
        cond["observedGeneration"] = generation
        conds.append({k: v for k, v in cond.items() if v is not None})
    dstatus = (deployment or {}).get("status", {})
    result = {
        "observedGeneration": generation,
        "replicas": dstatus.get("replicas", 0),
        "readyReplicas": dstatus.get("readyReplicas", 0),
        "url": url(name, namespace, cluster_domain()),
        "selector": f"{OWNER_LABEL}={name}",
        "conditions": conds,
        "adapters": adapter_states or None,
    }
    result = {k: v for k, v in result.items() if v is not None}
    if adapter_states == [] and previous.get("adapters"):
        result["adapters"] = None  # a merge patch's way to remove the field
    return result


# Posted by the pass that finds them, once per problem (not as news of the status).
SPEC_PROBLEMS = ("InvalidSpec", "NameConflict", "ObjectTooLarge", "Forbidden")
FEATURE_CONDITIONS = ("RoutingReady", "AutoscalingReady")


def _find(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c.get("type") == type_), {})


def already_reported(previous: dict[str, Any], problem: tuple[str, str]) -> bool:
    """Whether the stored status already says `problem` (Ready with the same reason and
    message): its Warning was posted when the status was written, by this operator process or
    an earlier one, so a restart has nothing new to say."""
    ready = _find(previous, "Ready")
    return (ready.get("status"), ready.get("reason"), ready.get("message")) == (
        "False", *problem)


def _adapter_events(previous: dict[str, Any], current: dict[str, Any]
                    ) -> list[tuple[str, str, str]]:
    """A Warning AdapterFailed for each adapter that turned Failed or fails for a new reason;
    the stored status remembers it, so resyncs and operator restarts post nothing again."""
    before = {a.get("name"): a for a in previous.get("adapters") or []}
    found = []
    for adapter in current.get("adapters") or []:
        old = before.get(adapter["name"], {})
        if adapter["state"] == FAILED and (old.get("state"), old.get("message")) != (
                FAILED, adapter["message"]):
            found.append(("Warning", "AdapterFailed",
                          f"adapter {adapter['name']}: {adapter['message']}"))
    return found


def events(previous: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, reason, message) Events worth posting for a status change: Degraded turning True
    or changing its reason (a person must act), an adapter failing (AdapterFailed), a
    feature's child refused (Forbidden in RoutingReady or AutoscalingReady), Ready
    turning True, and Ready turning False from True (a Normal RollingOut when a spec change
    rolls out). The first Ready=False of a new service is no news."""
    found = []
    old_degraded, degraded = _find(previous, "Degraded"), _find(current, "Degraded")
    degraded_news = degraded.get("status") == "True" and (
        old_degraded.get("status") != "True" or old_degraded.get("reason") != degraded["reason"])
    if degraded_news and degraded["reason"] not in SPEC_PROBLEMS:
        found.append(("Warning", degraded["reason"], degraded.get("message", "")))
    found += _adapter_events(previous, current)
    for kind in FEATURE_CONDITIONS:  # a feature's child refused: the engines serve on
        old, new = _find(previous, kind), _find(current, kind)
        if new.get("reason") == "Forbidden" and (old.get("reason"), old.get("message")) != (
                "Forbidden", new.get("message")):
            found.append(("Warning", "Forbidden", f"{kind}: {new.get('message', '')}"))
    old_ready, ready = _find(previous, "Ready"), _find(current, "Ready")
    if ready.get("status") == "True" and old_ready.get("status") != "True":
        found.append(("Normal", ready["reason"], ready.get("message", "")))
    elif (ready.get("status") == "False" and old_ready.get("status") == "True"
          and not degraded_news and ready["reason"] not in SPEC_PROBLEMS):
        kind = "Normal" if ready["reason"] == "RollingOut" else "Warning"  # a spec change
        found.append((kind, ready["reason"], ready.get("message", "")))
    return found
