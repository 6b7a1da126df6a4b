"""Status and the reconcile pass, without a cluster: conditions as a Deployment moves, and
children written only when they drift (against an in-memory API)."""

from __future__ import annotations

import copy

from operator_support import inference_service

from tokenmill.operator import status
from tokenmill.operator.reconcile import covers, reconcile, removals

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def deployment(replicas=2, generation=3, observed=3, updated=2, ready=2, available=2, total=2,
               conditions=()):
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "replicas": total,
                       "updatedReplicas": updated, "readyReplicas": ready,
                       "availableReplicas": available, "conditions": list(conditions)}}


def conds(deploy, problem=None):
    return {c["type"]: (c["status"], c["reason"]) for c in status.conditions(deploy, problem)}


def test_all_ready():
    assert conds(deployment()) == {
        "Ready": ("True", "AllReplicasReady"), "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("False", "RolloutComplete"), "Degraded": ("False", "AsExpected")}


def test_rolling_out_keeps_available():
    c = conds(deployment(observed=2, updated=1, ready=2, available=2, total=3))
    assert c["Ready"] == ("False", "RollingOut")
    assert c["Available"] == ("True", "MinimumReplicasAvailable")
    assert c["Progressing"] == ("True", "RollingOut")


def test_nothing_ready_yet():
    c = conds(deployment(updated=2, ready=0, available=0))
    assert c["Ready"][0] == "False" and c["Available"] == ("False", "NoReplicasAvailable")


def test_stuck_rollout_is_degraded():
    stuck = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet has timed out progressing."}
    c = conds(deployment(updated=1, ready=1, available=1, conditions=[stuck]))
    assert c["Progressing"] == ("False", "ProgressDeadlineExceeded")
    assert c["Degraded"] == ("True", "ProgressDeadlineExceeded")


def test_replica_failure_is_degraded():
    failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
               "message": "exceeded quota"}
    assert conds(deployment(ready=0, available=0, conditions=[failure]))["Degraded"] == (
        "True", "FailedCreate")


def test_invalid_spec_with_and_without_a_running_deployment():
    problem = ("InvalidSpec", "spec.engine.quantization: bad")
    c = conds(deployment(), problem)
    assert c["Ready"] == ("False", "InvalidSpec") and c["Degraded"] == ("True", "InvalidSpec")
    assert c["Available"] == ("True", "MinimumReplicasAvailable")  # the old version serves
    assert conds(None, problem)["Available"] == ("False", "InvalidSpec")


def test_scaled_to_zero():
    c = conds(deployment(replicas=0, updated=0, ready=0, available=0, total=0))
    assert c["Ready"] == ("False", "ScaledToZero")


def test_transition_times_move_only_on_change():
    first = status.status("a", "ns", 3, deployment(ready=0, available=0), None, {}, NOW)
    same = status.status("a", "ns", 3, deployment(ready=0, available=0), None, first, LATER)
    assert same == first
    ready = status.status("a", "ns", 3, deployment(), None, first, LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times["Ready"] == LATER and times["Degraded"] == NOW
    assert ready["url"] == "http://a.ns.svc.cluster.local:8000/v1"
    assert ready["selector"] == "tokenmill.io/inferenceservice=a"
    assert ready["observedGeneration"] == 3 and ready["readyReplicas"] == 2
    assert status.ready_changed(first, ready)["status"] == "True"
    assert status.ready_changed(ready, ready) is None


def test_covers_and_removals():
    assert covers({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}})
    assert not covers({"a": [1, 2]}, {"a": [1]})
    assert covers({"a": [{"x": 1, "default": 0}]}, {"a": [{"x": 1}]})
    assert removals({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}}) == {"a": None,
                                                                          "b": {"d": None}}


class MemoryKube:
    """The Kube interface over a dict, with JSON merge-patch semantics; counts writes."""

    def __init__(self):
        self.objects: dict[tuple, dict] = {}
        self.writes = 0

    def get(self, api_version, kind, namespace, name):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def _key(self, obj):
        return obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]

    def create(self, obj):
        self.writes += 1
        self.objects[self._key(obj)] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    def patch(self, obj, patch, subresource=""):
        self.writes += 1
        target = self.objects[self._key(obj)]
        _merge_patch(target, patch)
        return copy.deepcopy(target)

    def delete(self, obj):
        self.writes += 1
        self.objects.pop(self._key(obj), None)


def _merge_patch(target, patch):
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def pod_spec(kube):
    return kube.objects["Deployment", "default", "a"]["spec"]["template"]["spec"]


def test_reconcile_is_idempotent_and_removes_what_the_spec_dropped():
    kube = MemoryKube()
    body = inference_service("a", {"resources": {"gpus": 0}, "nodeSelector": {"pool": "cpu"},
                                   "replicas": 2})
    outcome = reconcile(kube, body, "img")
    assert [a[0] for a in outcome.actions] == ["Created", "Created", "Created"]
    writes = kube.writes
    assert reconcile(kube, body, "img").actions == [] and kube.writes == writes

    # The deployment controller adds defaults and status; that is not drift.
    live = kube.objects["Deployment", "default", "a"]
    live["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"
    live["status"] = {"replicas": 2}
    assert reconcile(kube, body, "img").actions == []

    body["spec"] = {"resources": {"gpus": 0}, "replicas": 1}
    outcome = reconcile(kube, body, "img")
    assert "nodeSelector" not in pod_spec(kube)
    assert pod_spec(kube)["dnsPolicy"] == "ClusterFirst"  # not ours: left alone
    assert ("PodDisruptionBudget", "default", "a") not in kube.objects
    assert {a[0] for a in outcome.actions} == {"Updated", "Deleted"}


def test_reconcile_refuses_children_it_does_not_own():
    kube = MemoryKube()
    kube.objects["Deployment", "default", "a"] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "a", "namespace": "default"}, "spec": {"replicas": 5}}
    outcome = reconcile(kube, inference_service("a", {"resources": {"gpus": 0}}), "img")
    assert outcome.problem[0] == "NameConflict"
    assert kube.objects["Deployment", "default", "a"]["spec"] == {"replicas": 5}


def test_reconcile_invalid_spec_leaves_children_alone():
    kube = MemoryKube()
    body = inference_service("a", {"resources": {"gpus": 0}})
    reconcile(kube, body, "img")
    writes = kube.writes
    body["spec"]["engine"] = {"quantization": "int4"}
    outcome = reconcile(kube, body, "img")
    assert outcome.problem[0] == "InvalidSpec" and kube.writes == writes
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "quantization" in ready["message"]
