"""The autoscaler inside a running operator, with idle engine pods whose /metrics is the
engine's own exposition (no model loaded): a new operator process carries on a scale-down wait
an earlier one began (the state is in status.autoscaler, not in memory), and in mode external
the operator never touches replicas."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
import pytest_asyncio
from aiohttp import web
from operator_support import (
    IS_PATH,
    engine_exposition,
    http_server,
    inference_service,
    running_operator,
)

pytestmark = pytest.mark.asyncio

NS = "default"
DELAY = 30
WAITED = 25  # seconds of the wait the previous operator already saw


@pytest_asyncio.fixture
async def idle_engine_port():
    """A port on 127.0.0.1 answering /metrics as an idle engine does."""
    async def metrics(request):
        return web.Response(text=engine_exposition(0, 0), content_type="text/plain")

    runner, port = await http_server("/metrics", metrics)
    yield port
    await runner.cleanup()


async def add_ready_pods(k, port: int, n: int = 3) -> None:
    for i in range(n):
        await k.request("POST", f"/api/v1/namespaces/{NS}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"chat-{i}", "namespace": NS,
                         "labels": {"tokenmill.io/inferenceservice": "chat"}},
            "spec": {"containers": [{"name": "engine", "ports": [
                {"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}})


async def test_new_operator_resumes_the_scale_down_wait_from_status(tmp_path, idle_engine_port):
    async with running_operator(tmp_path, env={"TOKENMILL_AUTOSCALE_INTERVAL": "0.5"}) as k:
        await add_ready_pods(k, idle_engine_port)
        since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=WAITED)
        isvc = inference_service("chat", {
            "replicas": 3, "resources": {"gpus": 0},
            "autoscaling": {"maxReplicas": 3, "scaleDownDelaySeconds": DELAY}})
        isvc["status"] = {"autoscaler": {
            "desiredReplicas": 3, "recommendedReplicas": 1, "reason": "ScaleDownPending",
            "scaleDownPendingSince": since.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "scaleDownTo": 1}}
        created = time.monotonic()
        await k.request("POST", IS_PATH.format(ns=NS), isvc)

        path = f"{IS_PATH.format(ns=NS)}/chat"

        async def scaled_down():
            obj = await k.get(path)
            return obj if obj["spec"].get("replicas") == 1 else None

        await k.eventually(scaled_down, timeout=DELAY - WAITED + 10)
        took = time.monotonic() - created
        # The wait ended where the earlier operator's would have, not DELAY after this start.
        assert DELAY - WAITED - 2 <= took <= DELAY - WAITED + 6, took

        async def recorded():
            status = ((await k.get(path)).get("status") or {}).get("autoscaler") or {}
            return status if status.get("desiredReplicas") == 1 else None

        status = await k.eventually(recorded)
        assert status["reason"] in ("ScaledDown", "Steady") and status["lastScaleTime"]
        assert "scaleDownPendingSince" not in status
        (event,) = [e for e in await k.events() if e["reason"] == "ScaledDown"]
        assert event["message"].startswith("3 -> 1 replicas after ")
        await k.eventually(lambda: _replicas(k, 1))  # reconcile rolled it out


async def test_external_mode_leaves_replicas_alone(tmp_path, idle_engine_port):
    async with running_operator(tmp_path, env={"TOKENMILL_AUTOSCALE_INTERVAL": "0.5"}) as k:
        await add_ready_pods(k, idle_engine_port)
        await k.request("POST", IS_PATH.format(ns=NS), inference_service("chat", {
            "replicas": 3, "resources": {"gpus": 0},
            "autoscaling": {"mode": "external", "minReplicas": 0, "maxReplicas": 2,
                            "scaleDownDelaySeconds": 0}}))
        await k.eventually(lambda: _replicas(k, 3))
        await asyncio.sleep(3)  # six intervals, idle pods: builtin would have scaled to 1
        obj = await k.get(f"{IS_PATH.format(ns=NS)}/chat")
        assert obj["spec"]["replicas"] == 3 and "autoscaler" not in (obj.get("status") or {})
        assert await _replicas(k, 3)  # outside [min, max]: KEDA's number is used as is
        # What KEDA or an HPA does through the scale subresource reaches the Deployment.
        await k.request("PATCH", f"{IS_PATH.format(ns=NS)}/chat", {
            "metadata": {"generation": 2}, "spec": {"replicas": 5}})
        await k.eventually(lambda: _replicas(k, 5))


async def _replicas(k, n: int) -> bool:
    deployment = await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/chat")
    return bool(deployment) and deployment["spec"]["replicas"] == n


async def test_loading_pods_are_not_a_metrics_failure(tmp_path):
    """No ready pod is a service loading its model (no Warning); a ready pod that does not
    answer on /metrics is a failure a person must look at (a MetricsUnavailable Warning)."""
    async def broken(request):
        return web.Response(status=500, text="engine error")

    runner, port = await http_server("/metrics", broken)
    path = f"{IS_PATH.format(ns=NS)}/chat"
    try:
        async with running_operator(tmp_path, env={"TOKENMILL_AUTOSCALE_INTERVAL": "0.5"}) as k:
            await k.request("POST", IS_PATH.format(ns=NS), inference_service("chat", {
                "replicas": 1, "resources": {"gpus": 0}, "autoscaling": {"maxReplicas": 3}}))

            async def autoscaler_reason(reason: str) -> bool:
                status = ((await k.get(path)).get("status") or {}).get("autoscaler") or {}
                return status.get("reason") == reason

            await k.eventually(lambda: autoscaler_reason("NoReadyPods"))
            await asyncio.sleep(2)  # four more decisions without a ready pod
            assert not await _events(k, "MetricsUnavailable")

            await add_ready_pods(k, port, n=1)
            (event,) = await k.eventually(lambda: _events(k, "MetricsUnavailable"))
            assert event["type"] == "Warning"
            assert "no ready pod answered on /metrics" in event["message"]
            await k.eventually(lambda: autoscaler_reason("NoMetrics"))
    finally:
        await runner.cleanup()


async def test_writes_and_events_name_the_operator(tmp_path):
    """Field managers and Event sources say tokenmill, and spec.replicas written by the built-in
    autoscaler is owned by `tokenmill-autoscaler`, the name a conflicting server-side apply of
    the user's manifest shows."""
    async def busy(request):
        return web.Response(text=engine_exposition(10, 2), content_type="text/plain")

    runner, port = await http_server("/metrics", busy)
    try:
        async with running_operator(tmp_path, env={"TOKENMILL_AUTOSCALE_INTERVAL": "0.5"}) as k:
            await add_ready_pods(k, port, n=1)
            await k.request("POST", IS_PATH.format(ns=NS), inference_service("chat", {
                "replicas": 1, "resources": {"gpus": 0}, "autoscaling": {"maxReplicas": 3}}))
            (scaled,) = await k.eventually(lambda: _events(k, "ScaledUp"))
            await k.eventually(lambda: _replicas(k, 2))  # 12 requests, 2 running per engine
            assert await _events(k, "Created")

            source = (scaled["source"]["component"], scaled.get("reportingComponent"))
            assert source == ("tokenmill-operator", "tokenmill-operator")
            managers = dict.fromkeys(k.managers)
            assert ("inferenceservices", "tokenmill-autoscaler") in managers
            assert ("deployments", "tokenmill-operator") in managers
            assert ("inferenceservices/status", "tokenmill-operator") in managers
            assert {manager for _, manager in managers} == {"tokenmill-operator",
                                                            "tokenmill-autoscaler"}
            # Only spec.replicas is written under the autoscaler's name.
            assert {r for r, m in k.managers if m == "tokenmill-autoscaler"} == {
                "inferenceservices"}
    finally:
        await runner.cleanup()


async def _events(k, reason: str) -> list[dict]:
    return [e for e in await k.events() if e["reason"] == reason]
