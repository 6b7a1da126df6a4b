"""The operator against an emulator that stores what it is sent the way a real API server does:
quantities canonical ("1000m" is read back as "1"), and metadata.annotations at most 256 KiB
(apiserver_model/writes.py). A passing run converges and then writes nothing."""

from __future__ import annotations

import asyncio
import copy
import json

import aiohttp
import kopf
import pytest
from apiserver_model.writes import ANNOTATIONS_LIMIT, annotation_bytes
from operator_support import IS_PATH, admission_errors, inference_service, running_operator

from tokenmill.operator import manifests
from tokenmill.operator.bookkeeping import DigestDiffBaseStorage, skeleton
from tokenmill.operator.spec import MAX_MAP_ENTRIES, MAX_POD_ANNOTATION_VALUE, parse

NS = "default"
ISVCS = IS_PATH.format(ns=NS)
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/chat"
RESYNC = 0.3
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
DIFFBASE = "tokenmill.io/last-handled-configuration"  # kopf's record of the handled spec


async def _found(k, path, predicate):
    obj = await k.get(path)
    return obj if obj is not None and predicate(obj) else None


async def _reasons(k, reason: str) -> list[dict]:
    return [e for e in await k.events() if e["reason"] == reason]


def _deployment_writes(k) -> int:
    return sum(1 for call in k.calls if call[1] == "deployments" and call[2] in ("patch", "update"))


async def _metric(k, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(k.metrics) as response:
        text = await response.text()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith(name + "{"))


@pytest.mark.asyncio
async def test_canonical_quantities_are_not_patched_again(tmp_path):
    """The server reads "1000m" back as "1": a string comparison would patch the Deployment on
    every pass and post an Updated Event each time."""
    async with running_operator(tmp_path, env={"TOKENMILL_RESYNC_SECONDS": str(RESYNC)}) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0, "cpu": "1000m", "memory": "4096Mi"},
            "env": [{"name": "MEMORY_MIB", "valueFrom": {"resourceFieldRef": {
                "resource": "requests.memory", "divisor": "1024Ki"}}}]}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"},
                                          "limits": {"memory": "4Gi"}}
        (memory,) = [e for e in container["env"] if e["name"] == "MEMORY_MIB"]
        assert memory["valueFrom"]["resourceFieldRef"]["divisor"] == "1Mi"
        await asyncio.sleep(4 * RESYNC)  # settles
        writes, updated = _deployment_writes(k), len(await _reasons(k, "Updated"))
        await asyncio.sleep(8 * RESYNC)  # several resync passes, each reading the Deployment
        assert _deployment_writes(k) == writes
        assert len(await _reasons(k, "Updated")) == updated == 0

        # A real change of a quantity still rolls out.
        await k.request("PATCH", f"{ISVCS}/chat", {"metadata": {"generation": 2},
                                                   "spec": {"resources": {"cpu": "1500m"}}})
        await k.eventually(lambda: _found(k, DEPLOY, lambda d: d["spec"]["template"]["spec"][
            "containers"][0]["resources"]["requests"]["cpu"] == "1500m"))


def _big_spec() -> dict:
    """An admissible spec of about 150 KiB: many variables with long values."""
    env = [{"name": f"SETTING_{i}", "value": f"{i}:" + "x" * 1200} for i in range(128)]
    return {"resources": {"gpus": 0}, "env": env}


def kubectl_applied(obj: dict) -> dict:
    """The object as client-side `kubectl apply` writes it: the manifest once more, as JSON, in
    the last-applied-configuration annotation."""
    manifest = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                "metadata": {"name": obj["metadata"]["name"],
                             "namespace": obj["metadata"]["namespace"]},
                "spec": obj["spec"]}
    applied = copy.deepcopy(obj)
    applied["metadata"].setdefault("annotations", {})[LAST_APPLIED] = (
        json.dumps(manifest, separators=(",", ":")) + "\n")
    return applied


def _added(obj: dict, before: dict | None = None) -> int:
    """Bytes of the annotations the operator (and kopf) added to an object."""
    ours = {k: v for k, v in (obj["metadata"].get("annotations") or {}).items()
            if k not in (before or {})}
    return annotation_bytes(ours)


@pytest.mark.asyncio
async def test_a_big_spec_keeps_the_operators_bookkeeping_small(tmp_path):
    spec = _big_spec()
    isvc = kubectl_applied(inference_service("chat", spec))
    assert admission_errors(inference_service("chat", spec)) == []
    theirs = isvc["metadata"]["annotations"]
    assert 128 * 1024 < annotation_bytes(theirs) < ANNOTATIONS_LIMIT
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, isvc)
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        await k.eventually(lambda: _found(k, f"{ISVCS}/chat", lambda o: (
            o.get("status") or {}).get("conditions")))
        # kopf recorded the spec it handled (else every event is handled as a new object),
        # and no write of the operator's was refused.
        await k.eventually(lambda: _found(k, f"{ISVCS}/chat", lambda o: DIFFBASE in o[
            "metadata"].get("annotations", {})))
        assert "Too long" not in k.log.read_text()
        assert _added(await k.get(f"{ISVCS}/chat"), theirs) < 512
        assert _added(deployment) < 2048
        assert await _metric(k, "tokenmill_operator_reconcile_errors_total") == 0


@pytest.mark.asyncio
async def test_annotations_that_leave_no_room_are_reported(tmp_path):
    """The object's own annotations nearly fill the 256 KiB: kopf's record would be refused.
    The operator does not write it, still serves and writes status, and says why."""
    isvc = inference_service("chat", {"resources": {"gpus": 0}})
    isvc["metadata"]["annotations"] = {"example.com/notes": "x" * (ANNOTATIONS_LIMIT - 100)}
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, isvc)
        await k.eventually(lambda: k.get(DEPLOY))
        (warning,) = await k.eventually(lambda: _reasons(k, "ObjectTooLarge"))
        assert warning["type"] == "Warning"
        assert f"metadata.annotations: {ANNOTATIONS_LIMIT - 83} bytes" in warning["message"]
        assert "--server-side" in warning["message"]
        await k.eventually(lambda: _found(k, f"{ISVCS}/chat", lambda o: (
            o.get("status") or {}).get("conditions")))
        assert await _metric(k, "tokenmill_operator_reconcile_errors_total") >= 1
        await asyncio.sleep(1)
        assert len(await _reasons(k, "ObjectTooLarge")) == 1
        assert "Too long" not in k.log.read_text()  # no write was refused


TOO_LARGE_BODY = "Request entity too large: limit is 3145728"  # the API server's 413


@pytest.mark.asyncio
async def test_a_child_refused_as_too_large_is_counted_and_reported(tmp_path):
    refuse = {("deployments", "create"): (413, TOO_LARGE_BODY)}
    async with running_operator(tmp_path, refuse=refuse) as k:
        await k.request("POST", ISVCS, inference_service("chat", {"resources": {"gpus": 0}}))
        isvc = await k.eventually(lambda: _found(k, f"{ISVCS}/chat", lambda o: any(
            c["reason"] == "ObjectTooLarge" for c in (o.get("status") or {}).get(
                "conditions", []))))
        ready = next(c for c in isvc["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and f"413 {TOO_LARGE_BODY}" in ready["message"]
        (warning,) = await k.eventually(lambda: _reasons(k, "ObjectTooLarge"))
        assert "refused a child as too large" in warning["message"]
        assert await _metric(k, "tokenmill_operator_reconcile_errors_total") >= 1
        assert not await _reasons(k, "ReconcileFailed")


# --- the records themselves ------------------------------------------------------------------

def _record(spec: dict) -> str:
    desired = manifests.deployment("chat", NS, "uid-1", parse(spec), "img")
    return json.dumps(skeleton(desired), sort_keys=True, separators=(",", ":"))


def test_the_deployments_record_does_not_grow_with_the_spec():
    small = _record({"resources": {"gpus": 0}, "env": [{"name": "A", "value": "1"}]})
    assert _record(_big_spec()) == small
    assert len(small) < 2048


def test_the_worst_pod_annotations_the_crd_admits_fit_the_pod_template():
    worst = {f"{'a' * 253}/{i:02d}{'n' * 61}": "v" * MAX_POD_ANNOTATION_VALUE
             for i in range(MAX_MAP_ENTRIES)}
    assert admission_errors(inference_service("chat", {"podAnnotations": worst})) == []
    desired = manifests.deployment("chat", NS, "uid-1", parse({"podAnnotations": worst}), "img")
    template = desired["spec"]["template"]["metadata"]["annotations"]
    assert 200 * 1024 < annotation_bytes(template) <= ANNOTATIONS_LIMIT
    longer = {**worst, "x": "v" * (MAX_POD_ANNOTATION_VALUE + 1)}
    assert admission_errors(inference_service("chat", {"podAnnotations": longer}))


def _body(spec: dict, annotations: dict | None = None) -> kopf.Body:
    obj = kubectl_applied(inference_service("chat", spec))
    obj["metadata"]["annotations"].update(annotations or {})
    return kopf.Body(obj)


def _stored(storage: DigestDiffBaseStorage, body: kopf.Body) -> dict:
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    return dict(patch.get("metadata", {}).get("annotations", {}))


def test_kopfs_record_is_a_digest_that_tells_changes_apart():
    storage = DigestDiffBaseStorage(prefix="tokenmill.io")
    small, big = {"resources": {"gpus": 0}}, _big_spec()
    record = _stored(storage, _body(big))
    assert set(record) == {DIFFBASE, "tokenmill.io/kopf-managed"}
    assert len(record[DIFFBASE]) == len(_stored(storage, _body(small))[DIFFBASE]) < 80

    same = _body(big, record)  # unchanged since handled: kopf sees no difference
    assert storage.fetch(body=same) == storage.build(body=same)
    changed = _body(small, record)
    assert storage.fetch(body=changed) != storage.build(body=changed)
    assert storage.fetch(body=_body(small)) is None  # never handled: a new object

    # An object an older operator handled carries the whole essence: read as it is.
    legacy = _body(small, {DIFFBASE: json.dumps(storage.build(body=_body(small)))})
    assert storage.fetch(body=legacy) == storage.build(body=legacy)

    full = {"example.com/notes": "x" * (ANNOTATIONS_LIMIT - 100)}
    assert _stored(storage, kopf.Body(inference_service("chat", small) | {
        "metadata": {"name": "chat", "annotations": full}})) == {}


@pytest.mark.asyncio
async def test_empty_values_the_server_leaves_out_are_not_patched_again(tmp_path):
    """`value: ""` and `effect: ""` are stored as no key (Go's omitempty): comparing them as
    written would patch the Deployment on every pass."""
    async with running_operator(tmp_path, env={"TOKENMILL_RESYNC_SECONDS": str(RESYNC)}) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "env": [{"name": "EMPTY", "value": ""}],
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": ""}]}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        pod = deployment["spec"]["template"]["spec"]
        assert {"name": "EMPTY"} in pod["containers"][0]["env"]
        assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
        await asyncio.sleep(4 * RESYNC)  # settles
        writes = _deployment_writes(k)
        await asyncio.sleep(8 * RESYNC)
        assert _deployment_writes(k) == writes
        assert not await _reasons(k, "Updated")


@pytest.mark.asyncio
async def test_volumes_the_server_fills_in_are_not_patched_again(tmp_path):
    """The server gives a configMap or secret volume defaultMode 0644 and a volume naming no
    source an emptyDir: the spec's volumes, compared as written, would patch every pass."""
    async with running_operator(tmp_path, env={"TOKENMILL_RESYNC_SECONDS": str(RESYNC)}) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0},
            "volumes": [{"name": "templates", "configMap": {"name": "chat-templates"}},
                        {"name": "ca", "secret": {"secretName": "corporate-ca"}},
                        {"name": "work"}],
            "volumeMounts": [{"name": "templates", "mountPath": "/etc/templates"},
                             {"name": "ca", "mountPath": "/etc/ssl/corporate"},
                             {"name": "work", "mountPath": "/work"}]}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["templates"]["configMap"] == {"name": "chat-templates", "defaultMode": 420}
        assert volumes["ca"]["secret"]["defaultMode"] == 420
        assert volumes["work"]["emptyDir"] == {}
        await asyncio.sleep(4 * RESYNC)  # settles
        writes = _deployment_writes(k)
        await asyncio.sleep(8 * RESYNC)
        assert _deployment_writes(k) == writes
        assert not await _reasons(k, "Updated")

        # Removing a volume and its mount rolls out.
        await k.request("PATCH", f"{ISVCS}/chat", {"metadata": {"generation": 2}, "spec": {
            "volumes": [{"name": "ca", "secret": {"secretName": "corporate-ca"}}],
            "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate"}]}})
        await k.eventually(lambda: _found(k, DEPLOY, lambda d: "templates" not in [
            v["name"] for v in d["spec"]["template"]["spec"]["volumes"]]))
