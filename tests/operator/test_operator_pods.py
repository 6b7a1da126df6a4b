"""Why pods are not ready: the kubelet's, the scheduler's and the engine's words, read from Pod
objects shaped as the API server returns them, and /health asked over real HTTP."""

from __future__ import annotations

import random

import pytest
from aiohttp import web
from operator_support import http_server
from process_support import free_port

from tokenmill.operator.pods import (
    MESSAGE_CHARS,
    mount_failures,
    needs_action,
    pod_problem,
    why_not_ready,
)
from tokenmill.operator.scraper import health_reasons

GPU_FULL = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
            "available: 3 No preemption victims found for incoming pod.")
TRACEBACK = ("Traceback (most recent call last):\n"
             '  File "/app/tokenmill/engine/runner.py", line 88, in load\n'
             "    weights = load_file(path)\n"
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


FETCH_ERROR = ("tokenmill download: error: cannot fetch s3://models/llama: the store refused "
               "the credentials (InvalidAccessKeyId): check AWS_ACCESS_KEY_ID")
# What FallbackToLogsOnError puts in the termination message: the log's tail, progress first.
DOWNLOAD_LOG = ("ts=2026-01-01T00:00:01Z level=info logger=tokenmill.engine.models.fetch.progress"
                " msg=download model=s3://models/llama bytes=0 total=0\n" + FETCH_ERROR + "\n")


def status(name="engine", ready=False, restarts=0, running=False, waiting=None,
           terminated=None, last=None):
    """One containerStatuses entry; waiting is (reason, message), the others are dicts."""
    state = ({"running": {"startedAt": "2026-01-01T00:00:00Z"}} if running else
             {"waiting": {"reason": waiting[0], **({"message": waiting[1]} if waiting[1] else {})}}
             if waiting else {"terminated": terminated} if terminated else {})
    return {"name": name, "image": "ghcr.io/tokenmill/tokenmill:0.1.0", "imageID": "",
            "ready": ready, "restartCount": restarts, "started": running, "state": state,
            "lastState": {"terminated": last} if last else {}}


def exited(reason="Error", code=1, message=None):
    out = {"exitCode": code, "reason": reason, "startedAt": "2026-01-01T00:00:00Z",
           "finishedAt": "2026-01-01T00:01:00Z", "containerID": "containerd://abc"}
    return {**out, "message": message} if message else out


def pod(name, phase="Running", ready=False, containers=None, init=None, scheduled=True,
        unschedulable=None, ip="127.0.0.1", deleting=False, port=None):
    """A Pod of an InferenceService as the API server returns it."""
    conditions = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    if unschedulable:
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                       "message": unschedulable, "lastProbeTime": None,
                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    elif scheduled:
        for type_ in ("Initialized", "ContainersReady", "Ready"):
            conditions.append({"type": type_, "status": "True" if ready else "False",
                               "lastProbeTime": None,
                               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    st = {"phase": phase, "conditions": conditions, "qosClass": "Burstable"}
    if containers is not None:
        st["containerStatuses"] = containers
    if init is not None:
        st["initContainerStatuses"] = init
    if ip and phase == "Running":
        st["podIP"] = ip
    meta = {"name": name, "namespace": "default",
            "labels": {"tokenmill.io/inferenceservice": "llama"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:02:00Z"
    ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}] if port else []
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "engine", "ports": ports}]}, "status": st}


def healthy(name):
    return pod(name, ready=True, containers=[status(ready=True, running=True)])


def loading(name, **kw):
    return pod(name, containers=[status(running=True)], **kw)


def crashing(name, last=None, restarts=4, **kw):
    waiting = ("CrashLoopBackOff", f"back-off 1m20s restarting failed container=engine pod={name}")
    return pod(name, containers=[status(waiting=waiting, restarts=restarts,
                                        last=last or exited(message=TRACEBACK))], **kw)


def waiting_on(name, reason, message=None, phase="Pending"):
    return pod(name, phase=phase, containers=[status(waiting=(reason, message))])


PULL = ('failed to pull and unpack image "ghcr.io/tokenmill/tokenmill:nope": not found')

CASES = {
    "all ready": ([healthy("a"), healthy("b")], {}, None, []),
    "err image pull": ([waiting_on("a", "ErrImagePull", PULL)], {}, "ImagePullBackOff",
                       ["pod a: ErrImagePull: failed to pull", "tokenmill:nope"]),
    "image pull back-off": ([waiting_on("a", "ImagePullBackOff", 'Back-off pulling image "x"')],
                            {}, "ImagePullBackOff", ["pod a: ImagePullBackOff: Back-off"]),
    "invalid image name": ([waiting_on("a", "InvalidImageName",
                                       'Failed to apply default image tag "Bad:Name"')],
                           {}, "InvalidImageName", ["pod a: InvalidImageName: Failed to apply"]),
    "missing secret": ([waiting_on("a", "CreateContainerConfigError",
                                   'secret "hf-token" not found')], {},
                       "CreateContainerConfigError", ['secret "hf-token" not found']),
    "run container error": ([waiting_on("a", "RunContainerError", "exec: \"tokenmill\": "
                                        "executable file not found in $PATH", phase="Running")],
                            {}, "RunContainerError", ["executable file not found"]),
    "crash loop": ([crashing("a")], {}, "CrashLoopBackOff",
                   ["pod a: CrashLoopBackOff (4 restarts): last exit Error, exit code 1: ",
                    "CUDA out of memory"]),
    "oom killed in a crash loop": ([crashing("a", last=exited("OOMKilled", 137), restarts=1)], {},
                                   "OOMKilled",
                                   ["CrashLoopBackOff (1 restart): last exit OOMKilled, exit "
                                    "code 137"]),
    "oom killed just now": ([pod("a", containers=[status(terminated=exited("OOMKilled", 137))])],
                            {}, "OOMKilled", ["pod a: OOMKilled, exit code 137"]),
    "exited before back-off": ([pod("a", containers=[status(terminated=exited(code=2))])], {},
                               "ContainerFailed", ["pod a: Error, exit code 2"]),
    "unschedulable": ([pod("a", phase="Pending", unschedulable=GPU_FULL)], {}, "Unschedulable",
                      ["pod a: Unschedulable: 0/3 nodes are available: 3 Insufficient "
                       "nvidia.com/gpu."]),
    "init container crash loop": (
        [pod("a", phase="Pending", init=[status(
            "fetch-model", waiting=("CrashLoopBackOff", "back-off"), restarts=2,
            last=exited(message="403 Forbidden: s3://models/llama"))],
            containers=[status(waiting=("PodInitializing", None))])],
        {}, "CrashLoopBackOff",
        ["pod a: init container fetch-model: CrashLoopBackOff (2 restarts): last exit Error, "
         "exit code 1: 403 Forbidden"]),
    "downloading the model": (
        [pod("a", phase="Pending", init=[status("model-download", running=True)],
             containers=[status(waiting=("PodInitializing", None))])],
        {}, "Downloading", ["pod a: init container model-download: downloading the model",
                            "kubectl logs a -c model-download"]),
    "download failed, before the back-off": (
        [pod("a", phase="Pending", init=[status("model-download", terminated=exited(
            message=DOWNLOAD_LOG))], containers=[status(waiting=("PodInitializing", None))])],
        {}, "ModelDownloadFailed",
        [f"pod a: init container model-download: exit code 1: {FETCH_ERROR}"]),
    "download failing in a crash loop": (
        [pod("a", phase="Pending", init=[status(
            "model-download", waiting=("CrashLoopBackOff", "back-off 40s"), restarts=3,
            last=exited(message=DOWNLOAD_LOG))],
            containers=[status(waiting=("PodInitializing", None))])],
        {}, "ModelDownloadFailed",
        [f"pod a: init container model-download: exit code 1 (3 restarts): {FETCH_ERROR}"]),
    "a download beats a pod still being created": (
        [pod("a", phase="Pending", init=[status("model-download", running=True)]),
         waiting_on("b", "ContainerCreating")], {}, "Downloading", ["pod a: "]),
    "a loading engine beats another pod's download": (
        [pod("a", phase="Pending", init=[status("model-download", running=True)]),
         loading("b")], {"b": "loading"}, "Loading", ["pod b: loading"]),
    "download done, engine loading": (
        [loading("a", init=[status("model-download", terminated=exited("Completed", 0))])],
        {"a": "loading"}, "Loading", ["pod a: loading"]),
    "init container done, engine loading": (
        [loading("a", init=[status("fetch-model", terminated=exited("Completed", 0))])],
        {"a": "loading"}, "Loading", ["pod a: loading"]),
    "loading": ([loading("a")], {"a": "loading"}, "Loading", ["pod a: loading"]),
    "model failed to load": ([loading("a")],
                             {"a": "model failed to load: no such file: /models/llama"},
                             "ModelLoadFailed",
                             ["pod a: model failed to load: no such file: /models/llama"]),
    "engine loop stopped": ([loading("a")], {"a": "engine loop stopped"}, "EngineStopped",
                            ["pod a: engine loop stopped"]),
    "health unreachable": ([loading("a")], {"a": "/health unreachable: ClientConnectorError"},
                           "NotReady", ["pod a: /health unreachable"]),
    "running, no health answer": ([loading("a")], {}, "NotReady", ["pod a: running, not ready"]),
    "container creating": ([waiting_on("a", "ContainerCreating")], {}, "Starting",
                           ["pod a: ContainerCreating"]),
    "deleting and evicted pods are skipped": (
        [crashing("a", deleting=True), healthy("b"),
         pod("c", phase="Failed", scheduled=False, containers=[])],
        {}, None, []),
    "the old ReplicaSet's crash says why the rollout is stuck": (
        [healthy("new-1"), healthy("new-2"), crashing("old-1")], {}, "CrashLoopBackOff",
        ["pod old-1: CrashLoopBackOff"]),
    "pods sharing a reason are counted": (
        [crashing("a-2"), loading("a-3"), crashing("a-1"), healthy("a-4")], {"a-3": "loading"},
        "CrashLoopBackOff", ["2/4 pods, e.g. a-1: CrashLoopBackOff"]),
    "an image to fix beats a crash": (
        [crashing("a"), waiting_on("b", "ErrImagePull", PULL)], {}, "ImagePullBackOff",
        ["pod b: ErrImagePull"]),
    "unschedulable beats loading": (
        [loading("a"), pod("b", phase="Pending", unschedulable=GPU_FULL)], {"a": "loading"},
        "Unschedulable", ["pod b: Unschedulable"]),
}


@pytest.mark.parametrize("case", CASES)
def test_pod_problem(case):
    pods, health, reason, parts = CASES[case]
    found = pod_problem(pods, health)
    if reason is None:
        assert found is None
        return
    assert found[0] == reason
    for part in parts:
        assert part in found[1]
    assert "\n" not in found[1]
    shuffled = pods[:]
    random.Random(0).shuffle(shuffled)
    assert pod_problem(shuffled, health) == found  # stable whatever order the API lists


def test_long_logs_keep_their_end():
    log = "\n".join(f"line {i}: " + "x" * 60 for i in range(80)) + "\nValueError: bad rope"
    reason, message = pod_problem([crashing("a", last=exited(message=log))])
    assert reason == "CrashLoopBackOff" and message.endswith("ValueError: bad rope")
    assert len(message) < MESSAGE_CHARS + 120
    _, message = pod_problem([pod("a", phase="Pending", unschedulable=GPU_FULL * 10)])
    assert message.startswith("pod a: Unschedulable: 0/3 nodes") and message.endswith("...")


def test_a_failed_download_reports_the_tools_line_not_its_progress():
    failed = pod("a", phase="Pending", init=[status("model-download", terminated=exited(
        message=DOWNLOAD_LOG))])
    reason, message = pod_problem([failed])
    assert reason == "ModelDownloadFailed" and message.endswith(FETCH_ERROR)
    assert "msg=download" not in message


def test_ready_pods_have_no_problem_whatever_health_says():
    assert why_not_ready(healthy("a"), "draining") is None
    assert why_not_ready(loading("a"), "draining") == ("Draining", "draining")


@pytest.mark.parametrize(("reason", "degraded"), [
    ("ImagePullBackOff", True), ("InvalidImageName", True), ("CreateContainerConfigError", True),
    ("CreateContainerError", True), ("RunContainerError", True), ("CrashLoopBackOff", True),
    ("OOMKilled", True), ("ContainerFailed", True), ("Unschedulable", True),
    ("ModelLoadFailed", True), ("EngineStopped", True), ("ModelDownloadFailed", True),
    ("VolumeMountFailed", True),
    ("Loading", False), ("Downloading", False), ("Starting", False), ("NotReady", False),
    ("Draining", False)])
def test_needs_action(reason, degraded):
    assert needs_action(reason) is degraded


@pytest.mark.asyncio
async def test_health_reasons_over_http():
    asked = []

    def answering(status_code, body):
        async def handler(request):
            asked.append(request.url.port)
            if isinstance(body, dict):
                return web.json_response(body, status=status_code)
            return web.Response(text=body, status=status_code)
        return handler

    answers = [(503, {"status": "model failed to load: boom"}), (503, {"status": "loading"}),
               (200, {"status": "ok"}), (500, "Internal Server Error")]
    servers = [await http_server("/health", answering(*answer)) for answer in answers]
    failed, warming, ok, broken = (port for _, port in servers)
    try:
        closed = free_port()  # a port nothing listens on
        pods = [
            loading("failed", port=failed), loading("warming", port=warming),
            loading("ok", port=ok), loading("broken", port=broken),
            loading("down", port=closed),
            # Never asked: ready, crash-looping (nothing listens), going away, or no IP yet.
            pod("ready", ready=True, containers=[status(ready=True, running=True)], port=failed),
            crashing("crashing", port=failed), loading("leaving", deleting=True, port=failed),
            loading("no-ip", ip=None, port=failed),
        ]
        reasons = await health_reasons(pods)
    finally:
        for runner, _ in servers:
            await runner.cleanup()
    assert reasons == {"failed": "model failed to load: boom", "warming": "loading",
                       "broken": "/health answered HTTP 500",
                       "down": "/health unreachable: ClientConnectorError"}
    assert sorted(asked) == sorted([failed, warming, ok, broken])  # one request each
    assert pod_problem(pods, reasons) == ("ModelLoadFailed",
                                          "pod failed: model failed to load: boom")
    assert await health_reasons([]) == {}


MISSING_MAP = ('MountVolume.SetUp failed for volume "templates" : configmap "chat-templates" not '
               'found')


def failed_mount(pod_name: str, message: str, when: str, kind: str = "Pod",
                 reason: str = "FailedMount") -> dict:
    """A core/v1 Event as the kubelet writes it."""
    return {"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": reason,
            "message": message, "count": 3, "lastTimestamp": when,
            "metadata": {"name": f"{pod_name}.17a", "namespace": "default",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "involvedObject": {"kind": kind, "name": pod_name, "namespace": "default"},
            "source": {"component": "kubelet", "host": "node-1"}}


def creating(name: str) -> dict:
    return pod(name, phase="Pending", containers=[status(waiting=("ContainerCreating", None))])


def test_a_volume_the_kubelet_cannot_mount_is_named():
    """Without the Event the pod says only ContainerCreating, for ever."""
    assert pod_problem([creating("a")]) == ("Starting", "pod a: ContainerCreating")
    mounts = mount_failures([
        failed_mount("a", "MountVolume.SetUp failed: timed out", "2026-01-01T00:01:00Z"),
        failed_mount("a", MISSING_MAP, "2026-01-01T00:03:00Z"),
        failed_mount("a", "older", "2026-01-01T00:02:00Z"),
        failed_mount("a", "not a mount", "2026-01-01T00:09:00Z", reason="BackOff"),
        failed_mount("a", "a node's", "2026-01-01T00:09:00Z", kind="Node")])
    assert mounts == {"a": MISSING_MAP}
    reason, message = pod_problem([creating("a"), creating("b")], mounts=mounts)
    assert (reason, message) == ("VolumeMountFailed", f"pod a: FailedMount: {MISSING_MAP}")
    assert needs_action(reason)


def test_a_mount_failure_counts_only_while_the_pod_waits_for_its_volumes():
    mounts = {"a": MISSING_MAP}
    assert why_not_ready(loading("a"), "loading", MISSING_MAP)[0] == "Loading"  # mounted since
    unscheduled = pod("a", phase="Pending", unschedulable=GPU_FULL)
    assert pod_problem([unscheduled], mounts=mounts)[0] == "Unschedulable"
    assert pod_problem([healthy("a")], mounts=mounts) is None
