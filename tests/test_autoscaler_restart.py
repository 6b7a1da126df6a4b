"""A new operator process carries on a scale-down wait that an earlier one began: the state is
in status.autoscaler, not in memory. The pods are served by the engine's own metrics exposition
(idle engines), so no model is loaded."""

from __future__ import annotations

import datetime
import time

import pytest
from aiohttp import web
from operator_support import IS_PATH, inference_service, running_operator
from test_autoscaler_scraper import engine_exposition

pytestmark = pytest.mark.asyncio

NS = "default"
DELAY = 30
WAITED = 25  # seconds of the wait the previous operator already saw


async def test_new_operator_resumes_the_scale_down_wait_from_status(tmp_path):
    async def metrics(request):
        return web.Response(text=engine_exposition(0, 0), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with running_operator(tmp_path, env={"TOKENMILL_AUTOSCALE_INTERVAL": "0.5"}) as k:
            for i in range(3):  # three idle, ready engine pods
                await k.request("POST", f"/api/v1/namespaces/{NS}/pods", {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"chat-{i}", "namespace": NS,
                                 "labels": {"tokenmill.io/inferenceservice": "chat"}},
                    "spec": {"containers": [{"name": "engine", "ports": [
                        {"name": "http", "containerPort": port}]}]},
                    "status": {"phase": "Running", "podIP": "127.0.0.1",
                               "conditions": [{"type": "Ready", "status": "True"}]}})
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
    finally:
        await runner.cleanup()


async def _replicas(k, n: int) -> bool:
    deployment = await k.get(f"/apis/apps/v1/namespaces/{NS}/deployments/chat")
    return bool(deployment) and deployment["spec"]["replicas"] == n
