"""The built-in autoscaler's policy: one interval's observation and the saved state in, a decision
and the next state out.

A pure function, so every case (spike, decay, oscillation, missing metrics, restart) is a table
test without a cluster; scraping lives in scraper.py and the kopf wiring in handlers.py.

The rule. A replica holds a batch of running requests and, by the spec's `targetQueueDepth`,
that many waiting ones: its capacity is the largest running batch seen on any pod (the batch a
saturated engine reaches) plus the target. The load is every request in the servers, waiting or
running. The recommendation is `ceil(load / capacity)` within [minReplicas, maxReplicas], so a
queue above the target on every replica asks for more replicas at once, as many as the load
needs, and the queue draining after a scale-up does not ask for fewer (the running requests
still count). Within a tolerance band around the current replicas' capacity nothing changes.

Scaling up happens in the decision that sees the load. Scaling down waits until the
recommendation has stayed below the current replicas for `scaleDownDelaySeconds`, then goes to
the highest recommendation of that wait, in one step.

Pods that are not ready get no traffic (the Service skips them): they add no load and are not
asked for any. A ready pod whose metrics cannot be read is assumed to carry the mean load of the
ready pods that answered: it is neither zero load (which would scale down under load) nor a
reason to hold. Only when no ready pod answers is there nothing to decide on: the replicas and
the saved state stay as they are until metrics return. No ready pod at all is the normal state
of a service that is still loading its model (NoReadyPods), not a failure to read metrics
(NoMetrics).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

TOLERANCE = 0.1  # a load within 10% of the current replicas' capacity changes nothing

SCALED_UP = "ScaledUp"
SCALED_DOWN = "ScaledDown"
SCALE_DOWN_PENDING = "ScaleDownPending"
STEADY = "Steady"
NO_METRICS = "NoMetrics"
NO_READY_PODS = "NoReadyPods"
OUT_OF_BOUNDS = "OutOfBounds"


@dataclass(frozen=True)
class Policy:
    """The spec's autoscaling settings."""

    min_replicas: int
    max_replicas: int
    target_queue_depth: int
    scale_down_delay_seconds: float

    def bound(self, replicas: int) -> int:
        return min(max(replicas, self.min_replicas), self.max_replicas)


@dataclass(frozen=True)
class PodLoad:
    """One pod's scrape: requests waiting for a batch slot and requests in the batch."""

    waiting: float
    running: float


@dataclass(frozen=True)
class Observation:
    """One interval: the loads of the ready pods that answered, and how many pods are ready."""

    loads: tuple[PodLoad, ...]
    ready: int
    not_ready: int = 0


@dataclass(frozen=True)
class State:
    """What the policy remembers between intervals (kept in status, so it survives restarts)."""

    below_since: float | None = None  # when the recommendation fell below the replicas
    scale_down_to: int | None = None  # highest recommendation since then
    last_scale_time: float | None = None


@dataclass(frozen=True)
class Decision:
    """The replicas to set, why, and the numbers behind it."""

    replicas: int
    recommended: int | None  # what the load calls for now; None without metrics
    reason: str
    message: str
    state: State
    waiting: float | None = None  # estimated over all ready pods
    running: float | None = None
    capacity: float | None = None  # requests one replica holds at the target

    @property
    def scaled(self) -> bool:
        return self.reason in (SCALED_UP, SCALED_DOWN, OUT_OF_BOUNDS)


def recommend(policy: Policy, current: int, obs: Observation) -> tuple[int, float, float, float]:
    """(recommended replicas, waiting, running, capacity per replica) for one observation with
    at least one answering pod."""
    scale = max(obs.ready, len(obs.loads)) / len(obs.loads)
    waiting = sum(p.waiting for p in obs.loads) * scale
    running = sum(p.running for p in obs.loads) * scale
    capacity = max(p.running for p in obs.loads) + policy.target_queue_depth
    needed = (waiting + running) / capacity
    if current > 0 and abs(needed / current - 1) <= TOLERANCE:
        return current, waiting, running, capacity
    return policy.bound(math.ceil(needed)), waiting, running, capacity


def decide(policy: Policy, replicas: int, obs: Observation, state: State,
           now: float) -> Decision:
    """The decision for one interval; `replicas` is what spec.replicas says now."""
    current = policy.bound(replicas)
    if current != replicas:
        return Decision(current, None, OUT_OF_BOUNDS,
                        f"spec.replicas {replicas} is outside [{policy.min_replicas}, "
                        f"{policy.max_replicas}]", State(last_scale_time=now))
    if not obs.ready:  # starting or loading the model: the Ready condition says which
        return Decision(current, None, NO_READY_PODS,
                        f"no pod is ready yet; holding {current} replicas", state)
    if not obs.loads:
        return Decision(current, None, NO_METRICS,
                        f"no ready pod answered on /metrics; holding {current} replicas", state)

    recommended, waiting, running, capacity = recommend(policy, current, obs)
    numbers = dict(waiting=waiting, running=running, capacity=capacity)
    load = (f"{_n(waiting)} waiting and {_n(running)} running on {obs.ready} ready pods, "
            f"{_n(capacity)} per replica at the target")
    if recommended > current:
        return Decision(recommended, recommended, SCALED_UP,
                        f"{current} -> {recommended} replicas: {load}",
                        State(last_scale_time=now), **numbers)
    if recommended == current:
        return Decision(current, recommended, STEADY, f"{current} replicas: {load}",
                        State(last_scale_time=state.last_scale_time), **numbers)

    # A wait recorded for more replicas than there are now (bounds or spec.replicas changed by
    # hand since) is stale: start a new one.
    pending = state.below_since is not None and (state.scale_down_to or 0) < current
    since = state.below_since if pending else now
    target = max(recommended, state.scale_down_to or 0) if pending else recommended
    if now - since >= policy.scale_down_delay_seconds:
        return Decision(target, recommended, SCALED_DOWN,
                        f"{current} -> {target} replicas after {_n(now - since)}s below: {load}",
                        State(last_scale_time=now), **numbers)
    left = policy.scale_down_delay_seconds - (now - since)
    return Decision(current, recommended, SCALE_DOWN_PENDING,
                    f"{current} replicas, {target} would do: scaling down in {_n(left)}s "
                    f"unless the load rises; {load}",
                    State(since, target, state.last_scale_time), **numbers)


def _n(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


# --- the state and decision as status fields --------------------------------------------------

def _time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _text(t: float | None) -> str | None:
    if t is None:
        return None
    moment = datetime.datetime.fromtimestamp(t, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def state_from_status(autoscaler: dict[str, Any] | None) -> State:
    """The saved state in status.autoscaler (empty after a first start)."""
    saved = autoscaler or {}
    return State(below_since=_time(saved.get("scaleDownPendingSince")),
                 scale_down_to=saved.get("scaleDownTo"),
                 last_scale_time=_time(saved.get("lastScaleTime")))


def to_status(decision: Decision, obs: Observation) -> dict[str, Any]:
    """status.autoscaler: the decision, the numbers behind it and the state to resume from."""
    def rounded(x: float | None) -> float | None:
        return None if x is None else round(x, 2)
    fields = {
        "desiredReplicas": decision.replicas,
        "recommendedReplicas": decision.recommended,
        "reason": decision.reason,
        "message": decision.message,
        "lastScaleTime": _text(decision.state.last_scale_time),
        "scaleDownPendingSince": _text(decision.state.below_since),
        "scaleDownTo": decision.state.scale_down_to,
        "waitingRequests": rounded(decision.waiting),
        "runningRequests": rounded(decision.running),
        "capacityPerReplica": rounded(decision.capacity),
        "readyPods": obs.ready,
        "scrapedPods": len(obs.loads),
    }
    return fields


# Fields whose change is worth a status write; the metric values alone change every interval.
DECISION_FIELDS = ("desiredReplicas", "recommendedReplicas", "reason", "lastScaleTime",
                   "scaleDownPendingSince", "scaleDownTo", "readyPods", "scrapedPods")


def status_changed(previous: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    """Whether the decision moved on since the saved status (not just the metric values)."""
    previous = previous or {}
    return any(previous.get(key) != current.get(key) for key in DECISION_FIELDS)
