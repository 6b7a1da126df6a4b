"""The operator running for real (kopf, as `tokenmill operator`) against kmock's emulator.

kmock stores objects as written and runs no controllers: the tests play the API server's part
(uid, generation) and the Deployment controller's (status), and assert on what the operator
wrote.
"""

from __future__ import annotations

import asyncio

import pytest
from operator_support import IS_PATH, granted, inference_service, render_chart, running_operator

pytestmark = pytest.mark.asyncio

NS = "default"
ISVCS = IS_PATH.format(ns=NS)
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/chat"
SERVICE = f"/api/v1/namespaces/{NS}/services/chat"
PDB = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/chat"


def condition(isvc: dict | None, type_: str) -> dict:
    conds = ((isvc or {}).get("status") or {}).get("conditions", [])
    return next((c for c in conds if c["type"] == type_), {})


def command(deployment: dict) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["command"]


async def test_create_update_status_and_repair(tmp_path):
    async with running_operator(tmp_path, {"TOKENMILL_CLUSTER_DOMAIN": "corp.example"}) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "model": {"uri": "smollm2-135m-instruct"}, "resources": {"gpus": 0},
            "engine": {"maxNumSeqs": 16},
        }))

        # Create: a Deployment and a Service, owned by the InferenceService, with the flags.
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        service = await k.eventually(lambda: k.get(SERVICE))
        for child in (deployment, service):
            (owner,) = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("InferenceService", "chat",
                                                                    "uid-1")
            assert owner["controller"] is True
        args = command(deployment)
        assert args[:2] == ["tokenmill", "serve"]
        assert "--max-num-seqs" in args and args[args.index("--max-num-seqs") + 1] == "16"
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "tokenmill:test"
        assert await k.get(PDB) is None

        isvc = await k.eventually(lambda: k.get(f"{ISVCS}/chat"))
        isvc = await k.eventually(
            lambda: _with(k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason")
                          == "RollingOut"))
        assert isvc["status"]["url"] == "http://chat.default.svc.corp.example:8000/v1"
        assert isvc["status"]["observedGeneration"] == 1
        assert condition(isvc, "Progressing")["status"] == "True"
        reasons = {e["reason"] for e in await k.events()}
        assert "Created" in reasons

        async with k.session.get(k.liveness) as resp:  # the kubelet's liveness probe
            assert resp.status == 200

        # Status follows the Deployment as its controller advances it.
        await k.request("PATCH", f"{DEPLOY}/status", {"status": {
            "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
            "availableReplicas": 1}})
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("status") == "True"))
        assert condition(isvc, "Available")["status"] == "True"
        assert condition(isvc, "Progressing")["status"] == "False"
        assert condition(isvc, "Degraded")["status"] == "False"
        assert isvc["status"]["readyReplicas"] == 1
        assert await k.eventually(lambda: _events(k, "AllReplicasReady"))

        # A spec change rolls the Deployment (new flags) and scaling past 1 adds a PDB.
        await k.request("PATCH", f"{ISVCS}/chat", {
            "metadata": {"generation": 2}, "spec": {"engine": {"maxNumSeqs": 32}, "replicas": 2}})
        deployment = await k.eventually(lambda: _with(
            k, DEPLOY, lambda d: "32" in command(d)))
        assert deployment["spec"]["replicas"] == 2
        pdb = await k.eventually(lambda: k.get(PDB))
        assert pdb["spec"]["maxUnavailable"] == 1

        # A hand edit of a child is repaired; a deleted child is recreated.
        await k.request("PATCH", DEPLOY, {"spec": {"replicas": 7}})
        await k.eventually(lambda: _with(k, DEPLOY, lambda d: d["spec"]["replicas"] == 2))
        await k.request("DELETE", SERVICE)
        await k.eventually(lambda: k.get(SERVICE))

        # Back to one replica: the PDB goes.
        await k.request("PATCH", f"{ISVCS}/chat", {
            "metadata": {"generation": 3}, "spec": {"replicas": 1}})
        await k.eventually(lambda: _absent(k, PDB))

        # No Warning for the rollout of a new service; no finalizer that would make
        # `kubectl delete` wait for the operator.
        assert not [e for e in await k.events() if e["type"] == "Warning"]
        assert len(await _events(k, "RollingOut")) <= 2  # the scale to 2, then back to 1
        assert not (await k.get(f"{ISVCS}/chat"))["metadata"].get("finalizers")

    # Only the operator's children and engine pods come down its watches.
    managed = "app.kubernetes.io/managed-by=tokenmill-operator"
    watched = ("pods", "deployments", "services", "poddisruptionbudgets")
    assert {k.selectors.get(r) for r in watched} == {managed}, k.selectors

    # The chart's ClusterRoles grant every call the operator made, as a real API server's
    # authorizer would check them, blockOwnerDeletion's finalizers permission included.
    missing = set(k.calls) - granted(render_chart())
    assert ("tokenmill.io", "inferenceservices/finalizers", "update") in set(k.calls)
    assert not missing, f"the chart's RBAC lacks {sorted(missing)}"


# A log tail of 4-byte characters: the Event's message is under 1024 characters but over the
# 1024 bytes the API server takes.
CRASH_LOG = "🔥" * 400 + " model '/models/x' not found: no such directory"


async def test_pods_say_why_the_service_is_not_ready(tmp_path):
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("chat", {"resources": {"gpus": 0}}))
        await k.eventually(lambda: k.get(DEPLOY))
        # The kubelet's part: a pod of the service that keeps crashing.
        await k.request("POST", f"/api/v1/namespaces/{NS}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "chat-5d8f-x2k", "namespace": NS, "labels": {
                "tokenmill.io/inferenceservice": "chat",
                "app.kubernetes.io/managed-by": "tokenmill-operator"}},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "engine", "restartCount": 3, "ready": False,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {
                    "reason": "Error", "exitCode": 1,
                    "message": CRASH_LOG}}}]}})
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason")
            == "CrashLoopBackOff"))
        assert "model '/models/x' not found" in condition(isvc, "Ready")["message"]
        assert condition(isvc, "Degraded")["status"] == "True"
        warnings = await k.eventually(lambda: _events(k, "CrashLoopBackOff"))
        assert warnings[0]["type"] == "Warning" and "chat-5d8f-x2k" in warnings[0]["message"]
        assert warnings[0]["message"].endswith("not found: no such directory")
        await asyncio.sleep(1)
        assert len(await _events(k, "CrashLoopBackOff")) == 1


DOWNLOAD_FAILED = "cannot fetch s3://models/llama: bucket 'models' does not exist"


async def test_a_remote_model_is_downloaded_first_and_a_failed_download_is_reported(tmp_path):
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "model": {"uri": "s3://models/llama", "cache": {"pvc": "model-cache"},
                      "credentialsSecretRef": {"name": "s3-creds"}},
            "resources": {"gpus": 0}}))
        pod = (await k.eventually(lambda: k.get(DEPLOY)))["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["command"] == ["tokenmill", "download", "s3://models/llama",
                                   "--download-dir", "/model-cache"]
        assert init["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in (
            pod["volumes"])
        assert "/model-cache/s3/models/llama" in pod["containers"][0]["command"]

        # The kubelet's part: the download's pod, first downloading, then failed.
        pod_path = f"/api/v1/namespaces/{NS}/pods/chat-5d8f-x2k"
        await k.request("POST", f"/api/v1/namespaces/{NS}/pods", _pod("chat-5d8f-x2k", {
            "phase": "Pending", "initContainerStatuses": [{
                "name": "model-download", "restartCount": 0, "ready": False,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "Downloading"))
        assert condition(isvc, "Degraded")["status"] == "False"

        await k.request("PATCH", pod_path, {"status": {"initContainerStatuses": [{
            "name": "model-download", "restartCount": 0, "ready": False,
            "state": {"terminated": {"reason": "Error", "exitCode": 1,
                                     "message": f"tokenmill download: error: {DOWNLOAD_FAILED}\n"}},
        }]}})
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason")
            == "ModelDownloadFailed"))
        assert condition(isvc, "Ready")["status"] == "False"
        assert DOWNLOAD_FAILED in condition(isvc, "Ready")["message"]
        degraded = condition(isvc, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "ModelDownloadFailed")
        (warning,) = await k.eventually(lambda: _events(k, "ModelDownloadFailed"))
        assert warning["type"] == "Warning" and DOWNLOAD_FAILED in warning["message"]
    # The operator read no Secret, and the chart grants every call it made.
    assert not [c for c in k.calls if c[1].startswith("secrets")], k.calls
    assert not set(k.calls) - granted(render_chart())


def _pod(name: str, status: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {
                "tokenmill.io/inferenceservice": "chat",
                "app.kubernetes.io/managed-by": "tokenmill-operator"}},
            "status": status}


MISSING_MAP = ('MountVolume.SetUp failed for volume "templates" : configmap "chat-templates" not '
               'found')


@pytest.mark.parametrize("may_list", [True, False], ids=["events-listed", "older-chart"])
async def test_a_volume_that_cannot_be_mounted_is_reported(tmp_path, may_list):
    """A ConfigMap named by spec.volumes that does not exist: the pod waits in ContainerCreating
    for ever, and only the kubelet's FailedMount Event says why. An operator that may not list
    Events (an older chart's role) says what the pod says."""
    refuse = {} if may_list else {("events", "list"): (403, 'events is forbidden: User '
                                                       '"system:serviceaccount:x" cannot list')}
    async with running_operator(tmp_path, refuse=refuse) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0},
            "volumes": [{"name": "templates", "configMap": {"name": "chat-templates"}}],
            "volumeMounts": [{"name": "templates", "mountPath": "/etc/templates"}]}))
        await k.eventually(lambda: k.get(DEPLOY))
        # The kubelet's part: its Event, then the pod it cannot start.
        await k.request("POST", f"/api/v1/namespaces/{NS}/events", {
            "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedMount",
            "message": MISSING_MAP, "count": 4, "lastTimestamp": "2026-01-01T00:02:00Z",
            "metadata": {"name": "chat-5d8f-x2k.1", "namespace": NS},
            "involvedObject": {"kind": "Pod", "name": "chat-5d8f-x2k", "namespace": NS},
            "source": {"component": "kubelet", "host": "node-1"}})
        await k.request("POST", f"/api/v1/namespaces/{NS}/pods", _pod("chat-5d8f-x2k", {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                                   "state": {"waiting": {"reason": "ContainerCreating"}}}]}))
        if not may_list:
            isvc = await k.eventually(lambda: _with(
                k, f"{ISVCS}/chat", lambda o: "ContainerCreating" in condition(
                    o, "Ready").get("message", "")))
            assert condition(isvc, "Ready")["reason"] == "Starting"
            return
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason")
            == "VolumeMountFailed"))
        assert MISSING_MAP in condition(isvc, "Ready")["message"]
        assert condition(isvc, "Degraded")["reason"] == "VolumeMountFailed"
        (warning,) = await k.eventually(lambda: _events(k, "VolumeMountFailed"))
        assert "chat-templates" in warning["message"]
    assert ("", "events", "list") in set(k.calls)
    assert not set(k.calls) - granted(render_chart())


SA_MISSING = ('pods "chat-5d8f9-" is forbidden: error looking up service account default/engine: '
              'serviceaccount "engine" not found')


async def test_pods_the_api_server_refuses_block_ready(tmp_path):
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "serviceAccountName": "engine"}))
        await k.eventually(lambda: k.get(DEPLOY))
        # The Deployment controller's part: the ReplicaSet controller's pod create was refused
        # (only an Event on the ReplicaSet), which the Deployment shows as ReplicaFailure while
        # its own Progressing stays True until progressDeadlineSeconds.
        await k.request("PATCH", f"{DEPLOY}/status", {"status": {
            "observedGeneration": 1, "replicas": 0, "updatedReplicas": 0,
            "unavailableReplicas": 1, "conditions": [
                {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                 "message": "Deployment does not have minimum availability."},
                {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                 "message": 'ReplicaSet "chat-5d8f9" is progressing.'},
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                 "message": SA_MISSING}]}})
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "FailedCreate"))
        assert SA_MISSING in condition(isvc, "Ready")["message"]
        assert condition(isvc, "Progressing")["status"] == "False"
        assert condition(isvc, "Progressing")["reason"] == "FailedCreate"
        (warning,) = await k.eventually(lambda: _events(k, "FailedCreate"))
        assert warning["type"] == "Warning" and SA_MISSING in warning["message"]
        await asyncio.sleep(1)
        assert len(await _events(k, "FailedCreate")) == 1


async def test_timers_log_nothing_by_default(tmp_path):
    env = {"TOKENMILL_AUTOSCALE_INTERVAL": "0.3"}
    async with running_operator(tmp_path, env=env, verbose=False) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "autoscaling": {"maxReplicas": 2}}))
        await k.eventually(lambda: _with(k, f"{ISVCS}/chat", lambda o: (o.get("status") or {})
                                         .get("autoscaler")))
        await asyncio.sleep(2)  # several autoscaler runs
        assert "Timer 'autoscale'" not in k.log.read_text()  # kopf says it at INFO per run
        assert not (await k.get(f"{ISVCS}/chat"))["metadata"].get("finalizers")


async def test_invalid_spec_is_reported_not_retried(tmp_path):
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("bad", {
            "resources": {"gpus": 0}, "engine": {"quantization": "int4"}}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/bad", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        assert condition(isvc, "Ready")["status"] == "False"
        assert "spec.engine.quantization" in condition(isvc, "Ready")["message"]
        assert condition(isvc, "Degraded")["status"] == "True"
        warnings = await k.eventually(lambda: _events(k, "InvalidSpec"))
        assert warnings[0]["type"] == "Warning"
        assert await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/bad") is None

        # No retry storm: nothing more is written while the spec stays the same.
        before = await k.get(f"{ISVCS}/bad")
        await asyncio.sleep(2)
        assert len(await _events(k, "InvalidSpec")) == 1
        assert (await k.get(f"{ISVCS}/bad"))["status"] == before["status"]

        # Fixing the spec deploys it.
        await k.request("PATCH", f"{ISVCS}/bad", {
            "metadata": {"generation": 2}, "spec": {"engine": {"quantization": "none"}}})
        await k.eventually(lambda: k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/bad"))


async def test_a_restarted_operator_does_not_post_the_same_warning_again(tmp_path):
    """The status already says InvalidSpec with the same message: a new operator process (an
    upgrade, a rescheduled pod) has nothing new to tell."""
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("bad", {
            "resources": {"gpus": 0}, "engine": {"quantization": "int4"}}))
        await k.eventually(lambda: _with(
            k, f"{ISVCS}/bad", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        assert len(await k.eventually(lambda: _events(k, "InvalidSpec"))) == 1

        for _ in range(2):
            await k.restart()
            await k.eventually(lambda: k.handled_since_start("reconcile_service"))
            await asyncio.sleep(1)
        assert len(await _events(k, "InvalidSpec")) == 1


async def test_tensor_parallelism_deploys_or_says_why_not(tmp_path):
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 4}}))
        await k.request("POST", ISVCS, inference_service("bad", {
            "engine": {"tensorParallelSize": 2}}, uid="uid-2"))

        pod = (await k.eventually(lambda: k.get(DEPLOY)))["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "4"}
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in (
            pod["volumes"])
        assert {"name": "NCCL_DEBUG", "value": "WARN"} in c["env"]

        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/bad", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        message = condition(isvc, "Ready")["message"]
        assert "spec.engine.tensorParallelSize: 2 does not divide" in message
        assert "9 attention heads, 3 KV heads" in message
        (warning,) = await k.eventually(lambda: _events(k, "InvalidSpec"))
        assert warning["type"] == "Warning" and warning["message"] == message
        assert await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/bad") is None


async def test_api_key_reaches_the_engine_only_through_the_kubelet(tmp_path):
    """The Deployment names the Secret; the operator never reads it (its RBAC has no secrets),
    and the key is nowhere in what it writes."""
    key = "sk-tokenmill-never-seen"
    async with running_operator(tmp_path) as k:
        await k.request("POST", f"/api/v1/namespaces/{NS}/secrets", {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "chat-auth", "namespace": NS}, "stringData": {"api-key": key}})
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "auth": {"apiKeySecretRef": {"name": "chat-auth"}}}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "TOKENMILL_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": "chat-auth", "key": "api-key"}}} in c["env"]
        assert "--api-key" not in c["command"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health"
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "RollingOut"))

        # Pointing at another key rolls the pods onto it.
        await k.request("PATCH", f"{ISVCS}/chat", {"metadata": {"generation": 2}, "spec": {
            "auth": {"apiKeySecretRef": {"name": "chat-auth", "key": "rotated"}}}})
        deployment = await k.eventually(lambda: _with(k, DEPLOY, lambda d: any(
            e.get("valueFrom", {}).get("secretKeyRef", {}).get("key") == "rotated"
            for e in d["spec"]["template"]["spec"]["containers"][0]["env"])))
        written = [deployment, await k.get(SERVICE), await k.get(f"{ISVCS}/chat"),
                   *await k.events()]
        assert key not in repr(written) and key not in k.log.read_text()
        assert isvc["status"]["url"].startswith("http://chat.")
    assert not [c for c in k.calls if c[1].startswith("secrets")], k.calls
    assert not any(r == "secrets" for _, r, _ in granted(render_chart()))


async def _with(k, path, predicate):
    obj = await k.get(path)
    return obj if obj is not None and predicate(obj) else None


async def _absent(k, path):
    return await k.get(path) is None


async def _events(k, reason):
    return [e for e in await k.events() if e["reason"] == reason]


INVALID = ('Deployment.apps "bad" is invalid: spec.template.spec.tolerations[0].value: Invalid '
           'value: "x": value must be empty when `operator` is \'Exists\'')
FORBIDDEN = ('deployments.apps "chat" is forbidden: cannot set blockOwnerDeletion if an '
             'ownerReference refers to a resource you can\'t set finalizers on')


async def test_a_spec_the_deployment_api_refuses_is_invalid_spec_once(tmp_path):
    refuse = {("deployments", "create"): (422, INVALID)}
    async with running_operator(tmp_path, refuse=refuse) as k:
        await k.request("POST", ISVCS, inference_service("bad", {
            "resources": {"gpus": 0},
            "tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/bad", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        mapped = INVALID.replace("spec.template.spec.tolerations", "spec.tolerations")
        assert mapped in condition(isvc, "Ready")["message"]
        assert condition(isvc, "Degraded")["status"] == "True"
        await asyncio.sleep(2)
        assert len(await _events(k, "InvalidSpec")) == 1
        assert not await _events(k, "ReconcileFailed")


async def test_a_forbidden_write_is_in_the_status_and_one_event(tmp_path):
    """A 403 (RBAC, a quota, a webhook) may clear without a new spec, so the pass retries; the
    status says why meanwhile (it was left unwritten), and one Warning says it once."""
    refuse = {("deployments", "create"): (403, FORBIDDEN)}
    async with running_operator(tmp_path, refuse=refuse) as k:
        await k.request("POST", ISVCS, inference_service("chat", {"resources": {"gpus": 0}}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "Forbidden"))
        assert FORBIDDEN in condition(isvc, "Ready")["message"]
        assert condition(isvc, "Degraded")["status"] == "True"
        (event,) = await k.eventually(lambda: _events(k, "Forbidden"))
        assert event["type"] == "Warning" and FORBIDDEN in event["message"]
        assert "403" in event["message"]
        await asyncio.sleep(2)  # child events and another pass: no second Event
        assert len(await _events(k, "Forbidden")) == 1
        assert not await _events(k, "ReconcileFailed")
