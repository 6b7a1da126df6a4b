"""The built-in autoscaler end to end: the operator (a real process) against kmock's emulator,
real `tokenmill serve` engines (SmolLM2 on CPU) as the pods, and a load generator.

The engines run with --max-num-seqs 2 so a queue forms with a dozen streams. Settings are short
(0.5 s interval, 3 s scale-down delay) so the whole story fits in a couple of minutes; most of it
is the engines loading the model (from a safetensors copy of SmolLM2, which loads in seconds).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from autoscale_harness import Kubelet, Load
from operator_support import IS_PATH, inference_service, running_operator

pytestmark = pytest.mark.asyncio

NS = "default"
NAME = "chat"
INTERVAL = 0.5
DELAY = 3
STREAMS = 12  # 2 running + 10 waiting on one replica: 12 / (2 + 2) = 3 replicas at once
ENGINE_START = 120  # seconds for engines to load the model on a busy 2-core machine


async def until(kubelet_task: asyncio.Task, check, timeout: float, what: str):
    """Poll `check` (async) until truthy; fail early if the kubelet failed."""
    deadline = time.monotonic() + timeout
    while True:
        if kubelet_task.done():
            kubelet_task.result()  # raises what went wrong
            raise AssertionError("the kubelet stopped")
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        await asyncio.sleep(0.1)


async def test_queue_scales_up_at_once_and_down_once_after_the_delay(tmp_path, smollm2_dir):
    env = {"TOKENMILL_AUTOSCALE_INTERVAL": str(INTERVAL)}
    async with running_operator(tmp_path, env=env) as k:
        await k.request("POST", IS_PATH.format(ns=NS), inference_service(NAME, {
            "model": {"uri": str(smollm2_dir)},
            "resources": {"gpus": 0},
            "engine": {"maxNumSeqs": 2},
            "shutdownTimeoutSeconds": 5,
            "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetQueueDepth": 2,
                            "scaleDownDelaySeconds": DELAY},
        }))
        isvc_path = f"{IS_PATH.format(ns=NS)}/{NAME}"
        kubelet = Kubelet(k, NS, NAME, tmp_path)
        task = asyncio.create_task(kubelet.run())
        load = Load(kubelet, model=NAME)

        async def autoscaler() -> dict:
            return ((await k.get(isvc_path)).get("status") or {}).get("autoscaler") or {}

        try:
            # One replica, idle: the autoscaler reads it and holds.
            await until(task, lambda: _true(len(kubelet.ready) == 1), ENGINE_START,
                        "the first engine ready")
            idle = await until(task, lambda: _scraped(autoscaler, 1), 10, "a scrape")
            assert idle["reason"] == "Steady" and idle["desiredReplicas"] == 1

            # A queue forms: one decision takes 1 -> 3 replicas.
            await load.set_streams(STREAMS)
            loaded = time.monotonic()
            await until(task, lambda: _true(kubelet.counts()[-1] != 1), 30, "a scale-up")
            scale_up_s = kubelet.history[-1][0] - loaded
            assert kubelet.counts() == [1, 3]
            status = await autoscaler()
            assert status["reason"] in ("ScaledUp", "Steady") and status["desiredReplicas"] == 3
            assert status["waitingRequests"] > 0 and status["runningRequests"] > 0
            assert status["lastScaleTime"]

            # The harness starts the new engines; under steady load nothing changes.
            await until(task, lambda: _true(len(kubelet.ready) == 3), ENGINE_START,
                        "three engines ready")
            await until(task, lambda: _true(len({s.pod for s in load.results}) == 3), 60,
                        "requests served by every replica")
            await asyncio.sleep(4 * INTERVAL)
            assert kubelet.counts() == [1, 3]
            assert (await autoscaler())["desiredReplicas"] == 3

            # The load stops: after the delay, one scale-down to minReplicas.
            await load.set_streams(0)
            stopped = time.monotonic()
            await until(task, lambda: _true(kubelet.counts()[-1] == 1), DELAY + 20,
                        "the scale-down")
            scale_down_s = kubelet.history[-1][0] - stopped
            await asyncio.sleep(3 * INTERVAL)
            assert kubelet.counts() == [1, 3, 1]
            assert DELAY <= scale_down_s <= DELAY + 10, scale_down_s
            status = await autoscaler()
            assert status["reason"] in ("ScaledDown", "Steady") and status["desiredReplicas"] == 1

            # Events say what happened, and the operator's own metrics counted it.
            events = {e["reason"]: e for e in await k.events()}
            assert "1 -> 3 replicas" in events["ScaledUp"]["message"]
            assert "3 -> 1 replicas" in events["ScaledDown"]["message"]
            async with aiohttp.ClientSession() as http, http.get(k.metrics) as response:
                text = await response.text()
            assert 'tokenmill_operator_autoscaler_decisions_total{reason="ScaledUp"} 1.0' in text
            assert 'tokenmill_operator_autoscaler_decisions_total{reason="ScaledDown"} 1.0' in text
            assert scale_up_s < 3 * INTERVAL + 2, scale_up_s
            errors = [s.result.error for s in load.results if not s.result.ok]
            assert not errors, errors[:3]
        finally:
            await load.set_streams(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _true(value: bool) -> bool:
    return value


async def _scraped(autoscaler, pods: int) -> dict | None:
    status = await autoscaler()
    return status if status.get("scrapedPods") == pods else None

