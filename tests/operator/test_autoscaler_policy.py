"""The autoscaler's policy as tables: observations over time in, replica counts out."""

from __future__ import annotations

import pytest

from tokenmill.operator.autoscaler import (
    NO_METRICS,
    NO_READY_PODS,
    OUT_OF_BOUNDS,
    SCALE_DOWN_PENDING,
    SCALED_DOWN,
    SCALED_UP,
    STEADY,
    Observation,
    PodLoad,
    Policy,
    State,
    decide,
    state_from_status,
    status_changed,
    to_status,
)

INTERVAL = 5.0
POLICY = Policy(min_replicas=1, max_replicas=10, target_queue_depth=2,
                scale_down_delay_seconds=60)


def pods(*loads: tuple[float, float], ready: int | None = None, not_ready: int = 0):
    """An observation of ready pods with these (waiting, running) loads."""
    found = tuple(PodLoad(w, r) for w, r in loads)
    return Observation(found, len(found) if ready is None else ready, not_ready)


def even(replicas: int, in_flight: int, batch: int = 2) -> Observation:
    """`in_flight` requests spread over `replicas` engines of `batch` running slots each."""
    share = [in_flight // replicas + (i < in_flight % replicas) for i in range(replicas)]
    return pods(*[(max(n - batch, 0), min(n, batch)) for n in share])


def play(loads, replicas: int = 1, policy: Policy = POLICY, state: State | None = None,
         start: float = 1000.0):
    """Run the policy over a list of in-flight request counts (one per interval), spreading the
    load over the current replicas like a Service; returns the decisions."""
    state = state or State()
    decisions = []
    for i, load in enumerate(loads):
        obs = load if isinstance(load, Observation) else even(replicas, load)
        d = decide(policy, replicas, obs, state, start + i * INTERVAL)
        decisions.append(d)
        replicas, state = d.replicas, d.state
    return decisions


def replicas_of(decisions) -> list[int]:
    return [d.replicas for d in decisions]


def changes(decisions, start: int) -> list[int]:
    """The replica counts each time they changed, starting from `start`."""
    seen = [start]
    for d in decisions:
        if d.replicas != seen[-1]:
            seen.append(d.replicas)
    return seen


def test_idle_stays_at_min():
    decisions = play([0] * 50)
    assert set(replicas_of(decisions)) == {1}
    assert {d.reason for d in decisions} == {STEADY}


@pytest.mark.parametrize("in_flight", [9, 10, 11, 12, 13])
def test_steady_load_never_changes(in_flight):
    # 3 replicas of 2 running slots + 2 queued (capacity 4): 9 to 13 in flight fit in the band.
    decisions = play([in_flight] * 100, replicas=3)
    assert set(replicas_of(decisions)) == {3}
    assert {d.reason for d in decisions} == {STEADY}


def test_spike_scales_up_in_one_decision():
    # One replica with 38 waiting and 2 running: 40 requests / 4 per replica = 10 at once.
    (d,) = play([pods((38, 2))])
    assert (d.replicas, d.reason) == (10, SCALED_UP)
    assert "1 -> 10" in d.message and d.waiting == 38 and d.capacity == 4


def test_spike_is_capped_at_max_and_then_holds():
    decisions = play([pods((200, 2))] + [200] * 20)
    assert replicas_of(decisions) == [10] * 21
    assert decisions[0].reason == SCALED_UP
    assert {d.reason for d in decisions[1:]} == {STEADY}


def test_scale_up_needs_a_queue_above_the_target():
    # 1 replica, batch of 2 full: 2 waiting is the target, no change; 3 waiting (5 requests
    # for a capacity of 4, 25% over, outside the band) asks for a second replica.
    assert play([pods((2, 2))])[0].reason == STEADY
    assert play([pods((3, 2))])[0].replicas == 2


def test_queue_draining_after_scale_up_does_not_scale_down():
    # 12 requests: 1 -> 3 replicas; spread over 3 the queues drain to 2 each, the running
    # requests still count, so 3 stays.
    decisions = play([12] * 30)
    assert changes(decisions, 1) == [1, 3]
    assert decisions[0].reason == SCALED_UP


def test_oscillating_load_inside_the_band_changes_nothing():
    # 3 replicas hold 12 at the target; the load swings 11..13 (within 10%) for ten minutes.
    decisions = play([11, 13, 12, 13, 11, 12] * 20, replicas=3)
    assert set(replicas_of(decisions)) == {3}
    assert not any(d.scaled for d in decisions)


def test_scale_down_waits_for_the_delay_then_happens_once():
    decisions = play([12] * 4 + [0] * 30, replicas=3)
    # 60 s delay at 5 s intervals: the 13th low observation (60 s after the first) scales down.
    low = decisions[4:]
    assert all(d.reason == SCALE_DOWN_PENDING for d in low[:12])
    assert (low[12].replicas, low[12].reason) == (1, SCALED_DOWN)
    assert changes(decisions, 3) == [3, 1]
    assert [d.reason for d in low[13:]] == [STEADY] * 17


def test_load_returning_during_the_delay_cancels_the_scale_down():
    decisions = play([12] * 2 + [0] * 8 + [12] + [0] * 8, replicas=3)
    assert set(replicas_of(decisions)) == {3}
    assert decisions[10].reason == STEADY and decisions[10].state.below_since is None
    assert decisions[-1].reason == SCALE_DOWN_PENDING


def test_scale_down_goes_to_the_highest_need_of_the_wait():
    # From 6 replicas the need falls to 2, bumps to 4, then falls to 1: after the delay it goes
    # to 4 (the most the wait needed), not 1.
    loads = [24] + [8] * 4 + [16] + [4] * 10
    decisions = play(loads, replicas=6)
    scaled = [d for d in decisions if d.reason == SCALED_DOWN]
    assert [d.replicas for d in scaled] == [4]


def test_slow_decay_steps_down_one_delay_at_a_time():
    # 40 in flight on 10 replicas, falling by 1 every interval to 0.
    loads = list(range(40, -1, -1)) + [0] * 40
    decisions = play(loads, replicas=10)
    seen = changes(decisions, 10)
    assert seen == sorted(seen, reverse=True), "never scales back up while the load falls"
    assert seen[-1] == 1
    times = [i for i, d in enumerate(decisions) if d.reason == SCALED_DOWN]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g * INTERVAL >= POLICY.scale_down_delay_seconds for g in gaps)


def test_no_delay_scales_down_at_once():
    policy = Policy(1, 10, 2, scale_down_delay_seconds=0)
    (d,) = play([0], replicas=5, policy=policy)
    assert (d.replicas, d.reason) == (1, SCALED_DOWN)


def test_unscraped_ready_pods_carry_the_mean_load():
    # 3 ready pods, only one answers with a full queue: the other two are assumed as loaded.
    (d,) = play([pods((6, 2), ready=3)], replicas=3)
    assert d.waiting == 18 and d.running == 6
    assert d.replicas == 6 and d.reason == SCALED_UP
    # ... and unanswered pods are never zero load: no scale-down under load.
    decisions = play([pods((2, 2), ready=3)] * 30, replicas=3)
    assert set(replicas_of(decisions)) == {3}


def test_no_metrics_holds_and_keeps_the_state():
    pending = State(below_since=1000.0, scale_down_to=2, last_scale_time=900.0)
    # Ready pods that do not answer are a failure to read metrics; no ready pod at all is a
    # service still loading its model. Both hold.
    for obs, reason in ((pods(ready=3), NO_METRICS), (pods(ready=0, not_ready=3), NO_READY_PODS)):
        d = decide(POLICY, 3, obs, pending, 1030.0)
        assert (d.replicas, d.reason, d.state) == (3, reason, pending)
        assert d.recommended is None
    # When metrics come back after the delay the pending scale-down completes.
    d = decide(POLICY, 3, even(3, 0), pending, 1061.0)
    assert (d.replicas, d.reason) == (2, SCALED_DOWN)


def test_starting_pods_are_not_asked_for_again():
    # 10 replicas decided; 1 is ready with the whole queue, 9 are still loading the model.
    decisions = play([pods((38, 2), not_ready=9)] * 10, replicas=10)
    assert set(replicas_of(decisions)) == {10}
    # More load while they start: more replicas, at once, even with pods not ready.
    policy = Policy(1, 20, 2, 60)
    (d,) = play([pods((78, 2), not_ready=9)], replicas=10, policy=policy)
    assert (d.replicas, d.reason) == (20, SCALED_UP)


@pytest.mark.parametrize("replicas,expected", [(0, 2), (1, 2), (9, 5)])
def test_replicas_outside_the_bounds_are_corrected(replicas, expected):
    policy = Policy(2, 5, 2, 60)
    (d,) = play([0], replicas=replicas, policy=policy)
    assert (d.replicas, d.reason) == (expected, OUT_OF_BOUNDS)


def test_a_stale_wait_never_scales_up():
    # A wait toward 4 was recorded at 5 replicas; maxReplicas is now 3. The bound comes first
    # and drops the wait; the next low load starts a new one instead of "scaling down" to 4.
    policy = Policy(1, 3, 2, 60)
    stale = State(below_since=1000.0, scale_down_to=4)
    d = decide(policy, 5, even(3, 0), stale, 1100.0)
    assert (d.replicas, d.reason, d.state.below_since) == (3, OUT_OF_BOUNDS, None)
    d = decide(policy, 3, even(3, 0), stale, 1100.0)  # the same stale state read back
    assert (d.replicas, d.reason, d.state.below_since) == (3, SCALE_DOWN_PENDING, 1100.0)


def test_bounds_hold_under_any_load():
    policy = Policy(2, 4, 2, 0)
    for load in (0, 1, 7, 16, 17, 500, 3, 0):
        for replicas in range(2, 5):
            d = decide(policy, replicas, even(replicas, load), State(), 0.0)
            assert 2 <= d.replicas <= 4


def test_restart_resumes_a_pending_scale_down_from_status():
    first = play([12] * 2 + [0] * 6, replicas=3)  # 30 s into the 60 s wait
    saved = to_status(first[-1], even(3, 0))
    assert saved["reason"] == SCALE_DOWN_PENDING and saved["scaleDownTo"] == 1
    # A new operator process reads only the status.
    state = state_from_status(saved)
    assert state == first[-1].state
    # The operator was down for 10 s: the wait that began at t=1010 still ends at t=1070.
    resumed = play([0] * 8, replicas=3, state=state, start=1000 + 10 * INTERVAL)
    assert [d.reason for d in resumed][:4] == [SCALE_DOWN_PENDING] * 4
    assert (resumed[4].replicas, resumed[4].reason) == (1, SCALED_DOWN)


def test_status_fields_and_when_they_are_worth_writing():
    d = play([pods((38, 2))])[0]
    saved = to_status(d, pods((38, 2)))
    assert saved["desiredReplicas"] == 10 and saved["reason"] == SCALED_UP
    assert saved["waitingRequests"] == 38 and saved["runningRequests"] == 2
    assert saved["lastScaleTime"].endswith("Z") and saved["scrapedPods"] == 1
    assert status_changed(None, saved)
    assert not status_changed(saved, {**saved, "waitingRequests": 30, "message": "other"})
    assert status_changed(saved, {**saved, "reason": STEADY})
