"""The operator against an emulator that stores what it is sent the way a real API server does:
quantities canonical ("1000m" is read back as "1"), and metadata.annotations at most 256 KiB
(apiserver_model/writes.py). A passing run converges and then writes nothing."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from operator_support import IS_PATH, inference_service, running_operator

pytestmark = pytest.mark.asyncio

NS = "default"
ISVCS = IS_PATH.format(ns=NS)
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/chat"
RESYNC = 0.3


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


async def test_canonical_quantities_are_not_patched_again(tmp_path):
    """The server reads "1000m" back as "1": a string comparison would patch the Deployment on
    every pass and post an Updated Event each time."""
    async with running_operator(tmp_path, env={"TOKENMILL_RESYNC_SECONDS": str(RESYNC)}) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0, "cpu": "1000m", "memory": "4096Mi"}}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"},
                                          "limits": {"memory": "4Gi"}}
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

