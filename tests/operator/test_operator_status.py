"""Status and the reconcile pass, without a cluster: conditions as a Deployment moves, and
children written only when they drift (against an in-memory API)."""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes.client.exceptions import ApiException
from operator_support import inference_service

from tokenmill.operator import cluster_domain as cluster_domain_module
from tokenmill.operator import manifests, status
from tokenmill.operator.cluster_domain import cluster_domain, from_resolv_conf
from tokenmill.operator.reconcile import LAST_APPLIED, covers, reconcile, removals
from tokenmill.operator.spec import parse

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


SA_MISSING = ('pods "chat-5d8f9-" is forbidden: error looking up service account default/engine: '
              'serviceaccount "engine" not found')


@pytest.mark.parametrize("pod_problem", [None, ("ContainersNotReady", "engine not ready")])
def test_pods_that_cannot_be_created_block_ready_and_progress(pod_problem):
    """The ReplicaSet controller reports a pod the API server refuses (Pod Security, a missing
    ServiceAccount, quota) as the Deployment's ReplicaFailure; waiting changes nothing, so
    Ready says why and Progressing is False, while the Deployment's own Progressing stays True
    until its deadline."""
    failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
               "message": SA_MISSING}
    progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                   "message": 'ReplicaSet "chat-5d8f9" is progressing.'}
    deploy = deployment(replicas=1, updated=0, ready=0, available=0, total=0,
                        conditions=[progressing, failure])
    c = {cond["type"]: cond for cond in status.conditions(deploy, None, pod_problem)}
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "FailedCreate")
    assert c["Ready"]["message"] == f"0/1 replicas ready; {SA_MISSING}"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "FailedCreate")
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "FailedCreate")


def test_invalid_spec_with_and_without_a_running_deployment():
    problem = ("InvalidSpec", "spec.engine.quantization: bad")
    c = conds(deployment(), problem)
    assert c["Ready"] == ("False", "InvalidSpec") and c["Degraded"] == ("True", "InvalidSpec")
    assert c["Available"] == ("True", "MinimumReplicasAvailable")  # the old version serves
    assert conds(None, problem)["Available"] == ("False", "InvalidSpec")


def test_scaled_to_zero():
    c = conds(deployment(replicas=0, updated=0, ready=0, available=0, total=0))
    assert c["Ready"] == ("False", "ScaledToZero")


def test_transition_times_move_only_on_change(monkeypatch):
    monkeypatch.setenv("TOKENMILL_CLUSTER_DOMAIN", "cluster.local")
    cluster_domain.cache_clear()
    first = status.status("a", "ns", 3, deployment(ready=0, available=0), None, {}, NOW)
    same = status.status("a", "ns", 3, deployment(ready=0, available=0), None, first, LATER)
    assert same == first
    ready = status.status("a", "ns", 3, deployment(), None, first, LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times["Ready"] == LATER and times["Degraded"] == NOW
    assert ready["url"] == "http://a.ns.svc.cluster.local:8000/v1"
    assert ready["selector"] == "tokenmill.io/inferenceservice=a"
    assert ready["observedGeneration"] == 3 and ready["readyReplicas"] == 2
    assert status.events(first, ready) == [("Normal", "AllReplicasReady", "2/2 replicas ready")]
    assert status.events(ready, ready) == []


CRASH = ("CrashLoopBackOff", "pod a-1: CrashLoopBackOff (3 restarts): last exit Error, exit "
         "code 1: RuntimeError: no GPU")
POD_PROBLEMS = [
    ("ImagePullBackOff", "pod a-1: ErrImagePull: not found", True),
    ("InvalidImageName", "pod a-1: InvalidImageName: bad", True),
    ("CreateContainerConfigError", 'pod a-1: CreateContainerConfigError: secret "t" not found',
     True),
    ("RunContainerError", "pod a-1: RunContainerError: exec failed", True),
    (*CRASH, True),
    ("OOMKilled", "pod a-1: CrashLoopBackOff (1 restart): last exit OOMKilled", True),
    ("Unschedulable", "pod a-1: Unschedulable: 0/3 nodes are available", True),
    ("ModelLoadFailed", "pod a-1: model failed to load: boom", True),
    ("EngineStopped", "pod a-1: engine loop stopped", True),
    ("Loading", "2/2 pods, e.g. a-1: loading", False),
    ("Starting", "pod a-1: ContainerCreating", False),
    ("NotReady", "pod a-1: running, not ready", False),
]


def full_conds(deploy, problem=None, pod_problem=None):
    return {c["type"]: c for c in status.conditions(deploy, problem, pod_problem)}


@pytest.mark.parametrize(("reason", "message", "degraded"), POD_PROBLEMS)
def test_pod_problem_says_why_not_ready(reason, message, degraded):
    c = full_conds(deployment(ready=0, available=0), None, (reason, message))
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", reason)
    assert c["Ready"]["message"] == f"0/2 replicas ready; {message}"
    assert c["Available"]["reason"] == "NoReplicasAvailable"
    want = ("True", reason, message) if degraded else ("False", "AsExpected", "")
    assert (c["Degraded"]["status"], c["Degraded"]["reason"], c["Degraded"]["message"]) == want


def test_pod_problem_during_a_rollout_keeps_progress_and_availability():
    c = full_conds(deployment(observed=2, updated=1, ready=2, available=2, total=3), None, CRASH)
    assert (c["Ready"]["reason"], c["Degraded"]["reason"]) == ("CrashLoopBackOff",
                                                               "CrashLoopBackOff")
    assert c["Available"]["status"] == "True" and c["Progressing"]["reason"] == "RollingOut"
    stuck = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet has timed out progressing."}
    c = full_conds(deployment(updated=1, ready=1, available=1, conditions=[stuck]), None, CRASH)
    assert c["Progressing"]["reason"] == "ProgressDeadlineExceeded"
    assert c["Degraded"]["reason"] == "CrashLoopBackOff"  # the cause, not the symptom


def test_spec_problem_wins_over_pod_problem():
    invalid = ("InvalidSpec", "spec.engine.quantization: bad")
    for deploy in (deployment(ready=0, available=0), None):
        c = full_conds(deploy, invalid, CRASH)
        assert c["Ready"]["reason"] == "InvalidSpec" and c["Degraded"]["reason"] == "InvalidSpec"


def test_pod_problem_ignored_when_ready_scaled_to_zero_or_not_yet_deployed():
    assert conds(deployment(), None) == {
        t: (c["status"], c["reason"]) for t, c in full_conds(deployment(), None, CRASH).items()}
    zero = deployment(replicas=0, updated=0, ready=0, available=0, total=0)
    c = full_conds(zero, None, CRASH)
    assert c["Ready"]["reason"] == "ScaledToZero" and c["Degraded"]["status"] == "False"
    c = full_conds(None, None, CRASH)
    assert c["Ready"]["reason"] == "DeploymentMissing" and c["Degraded"]["status"] == "False"


def test_pod_problem_transitions():
    waiting = deployment(ready=0, available=0)
    loading = status.status("a", "ns", 3, waiting, None, {}, NOW,
                            ("Loading", "pod a-1: loading"))
    crash = status.status("a", "ns", 3, waiting, None, loading, LATER, CRASH)
    before = {c["type"]: c for c in loading["conditions"]}
    after = {c["type"]: c for c in crash["conditions"]}
    assert before["Ready"]["reason"] == "Loading" and after["Ready"]["reason"] == "CrashLoopBackOff"
    assert after["Ready"]["lastTransitionTime"] == NOW  # still False: no transition
    assert after["Degraded"]["lastTransitionTime"] == LATER
    assert status.events({}, loading) == []  # a new service loading: no news
    assert status.events(loading, crash) == [("Warning", *CRASH)]  # someone must act
    assert status.events(crash, crash) == []
    assert status.status("a", "ns", 3, waiting, None, {}, NOW) == status.status(
        "a", "ns", 3, waiting, None, {}, NOW, None)


def test_covers_and_removals():
    assert covers({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}})
    assert not covers({"a": [1, 2]}, {"a": [1]})
    assert covers({"a": [{"x": 1, "default": 0}]}, {"a": [{"x": 1}]})
    assert removals({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}}) == {"a": None,
                                                                          "b": {"d": None}}


def test_covers_compares_quantities_by_value():
    """The API server reads back "1000m" as "1" (apiserver_model/quantity.py): not drift."""
    divisor = {"env": [{"valueFrom": {"resourceFieldRef": {"divisor": "1Mi"}}}]}
    stored = {"containers": [{"resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
                              **divisor}],
              "volumes": [{"emptyDir": {"sizeLimit": "1536Mi"}}]}
    written = {"containers": [{"resources": {"requests": {"cpu": "1000m", "memory": "4096Mi"}},
                               "env": [{"valueFrom": {"resourceFieldRef": {
                                   "divisor": "1024Ki"}}}]}],
               "volumes": [{"emptyDir": {"sizeLimit": "1.5Gi"}}]}
    assert covers(stored, written)
    assert not covers(stored, {"containers": [{"resources": {"requests": {"cpu": "1500m"}}}]})
    assert not covers({"image": "1"}, {"image": "1000m"})  # only quantity fields


class MemoryKube:
    """The Kube interface over a dict, with JSON merge-patch semantics; counts writes."""

    def __init__(self):
        self.objects: dict[tuple, dict] = {}
        self.writes = 0

    def warnings(self) -> list[str]:
        return []  # what a dict cannot do: an API server's warnings on the last write

    def server_version(self) -> tuple[int, int] | None:
        return None  # an unknown version: no field is refused for it

    def get(self, api_version, kind, namespace, name):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def list(self, api_version, kind, namespace, labels):
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items()
                if k == kind and ns == namespace
                and labels.items() <= o["metadata"].get("labels", {}).items()]

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


def test_a_deployment_recorded_by_an_older_operator_still_loses_dropped_fields():
    """Older operators recorded the whole Deployment in tokenmill.io/last-applied; removals()
    reads that as it reads the key skeleton recorded now."""
    kube = MemoryKube()
    body = inference_service("a", {"resources": {"gpus": 0}, "nodeSelector": {"pool": "cpu"}})
    reconcile(kube, body, "img")
    live = kube.objects["Deployment", "default", "a"]
    whole = manifests.deployment("a", "default", "", parse(body["spec"]), "img")
    live["metadata"]["annotations"][LAST_APPLIED] = json.dumps(whole, sort_keys=True)
    body["spec"] = {"resources": {"gpus": 0}}
    assert [a[0] for a in reconcile(kube, body, "img").actions] == ["Updated"]
    assert "nodeSelector" not in pod_spec(kube)
    assert len(live["metadata"]["annotations"][LAST_APPLIED]) < 2048  # the skeleton now


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


class RefusingKube(MemoryKube):
    """Answers a Deployment write as the API server answers an invalid pod template."""

    def create(self, obj):
        if obj["kind"] == "Deployment":
            error = ApiException(status=422, reason="Unprocessable Entity")
            error.body = json.dumps({"kind": "Status", "message": REFUSAL})
            raise error
        return super().create(obj)


REFUSAL = ('Deployment.apps "a" is invalid: spec.template.spec.tolerations[0].operator: '
           'Invalid value: "Exist": value must be Exists or Equal')


def test_a_child_the_api_server_refuses_is_invalid_spec_with_its_message():
    """The API server's message, with the Deployment's path mapped to the spec's field."""
    outcome = reconcile(RefusingKube(), inference_service("a", {"resources": {"gpus": 0}}), "img")
    theirs = REFUSAL.replace("spec.template.spec.tolerations", "spec.tolerations")
    assert outcome.problem == ("InvalidSpec", f"the API server refused a child: 422 {theirs}")
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert theirs in ready["message"]


def test_pods_say_why_the_service_is_not_ready():
    kube = MemoryKube()
    body = inference_service("a", {"resources": {"gpus": 0}})
    reconcile(kube, body, "img")
    kube.objects["Deployment", "default", "a"]["status"] = {"observedGeneration": 1}
    kube.objects["Pod", "default", "a-1"] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a-1", "namespace": "default",
                     "labels": {"tokenmill.io/inferenceservice": "a"}},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "engine", "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                         "message": "model '/models/x' not found"}}}]}}
    ready = next(c for c in reconcile(kube, body, "img").status["conditions"]
                 if c["type"] == "Ready")
    assert ready["reason"] == "CrashLoopBackOff"
    assert "pod a-1" in ready["message"] and "model '/models/x' not found" in ready["message"]


def test_events_say_what_changed_once():
    ok = status.status("a", "ns", 3, deployment(), None, {}, NOW)
    rolling = status.status("a", "ns", 3, deployment(observed=2, updated=1), None, {}, NOW)
    assert status.events({}, rolling) == []  # a new service rolling out is no Warning
    lost = status.status("a", "ns", 3, deployment(ready=1, available=1), None, ok, LATER)
    assert status.events(ok, lost) == [("Normal", "RollingOut", "1/2 replicas ready")]
    unready = status.status("a", "ns", 3, deployment(ready=1), None, ok, LATER)
    assert status.events(ok, unready) == [("Warning", "ReplicasNotReady", "1/2 replicas ready")]
    crashed = status.status("a", "ns", 3, deployment(ready=1, available=1), None, ok, LATER,
                            CRASH)
    assert status.events(ok, crashed) == [("Warning", *CRASH)]  # once, as Degraded
    invalid = status.status("a", "ns", 3, deployment(), ("InvalidSpec", "bad"), ok, LATER)
    assert status.events(ok, invalid) == []  # the reconcile pass posts spec problems itself


@pytest.mark.parametrize(("spec", "message"), [
    ({"engine": {"tensorParallelSize": 2}},
     "spec.engine.tensorParallelSize: 2 does not divide the attention heads of "
     "smollm2-135m-instruct (9 attention heads, 3 KV heads, intermediate size 1536)"),
    ({"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 4},
      "resources": {"gpus": 2}},
     "spec.resources.gpus: 2 GPUs cannot hold tensorParallelSize 4"),
])
def test_tensor_parallelism_that_cannot_run_is_invalid_spec(spec, message):
    """Where no CEL runs, the operator refuses it: no Deployment, a condition naming the field."""
    kube = MemoryKube()
    outcome = reconcile(kube, inference_service("a", spec), "img")
    assert outcome.problem[0] == "InvalidSpec" and message in outcome.problem[1]
    assert ("Deployment", "default", "a") not in kube.objects
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert message in ready["message"]


def test_a_problem_already_in_the_status_was_reported():
    problem = ("InvalidSpec", "spec.engine.quantization: bad")
    written = status.status("a", "ns", 1, None, problem, {}, NOW)
    assert status.already_reported(written, problem)
    assert not status.already_reported(written, ("InvalidSpec", "spec.replicas: bad"))
    assert not status.already_reported({}, problem)


@pytest.mark.parametrize("resolv_conf, domain", [
    ("nameserver 10.96.0.10\nsearch ml.svc.cluster.local svc.cluster.local cluster.local\n"
     "options ndots:5\n", "cluster.local"),
    ("search team.svc.k8s.corp svc.k8s.corp k8s.corp ec2.internal\n", "k8s.corp"),
    ("search old.svc.a.b svc.a.b\nsearch ns.svc.c.d svc.c.d.\n", "c.d"),  # the last line counts
    ("nameserver 10.255.255.53\n", None),  # not a pod: no search path
    ("search example.com svc.\n", None),
])
def test_the_cluster_domain_is_read_from_the_pods_search_path(resolv_conf, domain):
    assert from_resolv_conf(resolv_conf) == domain


def test_the_cluster_domain_is_the_flags_then_resolv_confs_then_cluster_local(tmp_path,
                                                                              monkeypatch):
    conf = tmp_path / "resolv.conf"
    monkeypatch.setattr(cluster_domain_module, "RESOLV_CONF", str(conf))
    monkeypatch.delenv("TOKENMILL_CLUSTER_DOMAIN", raising=False)
    try:
        for text, expected in [(None, "cluster.local"), ("nameserver 1.1.1.1\n", "cluster.local"),
                               ("search a.svc.k8s.corp svc.k8s.corp\n", "k8s.corp")]:
            if text is not None:
                conf.write_text(text)
            cluster_domain.cache_clear()
            assert cluster_domain() == expected
        monkeypatch.setenv("TOKENMILL_CLUSTER_DOMAIN", "given.example.")
        cluster_domain.cache_clear()
        assert cluster_domain() == "given.example"
        ready = status.status("a", "ns", 1, deployment(), None, {}, NOW)
        assert ready["url"] == "http://a.ns.svc.given.example:8000/v1"
    finally:
        cluster_domain.cache_clear()
