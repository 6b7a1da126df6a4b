"""Reads the engines' queues: the ready pods of an InferenceService and their /metrics.

Which pods count is decided here from the Pod objects (ready, with an IP); what their numbers
mean for the replica count is decided by the policy in autoscaler.py. Scrapes of all pods run
concurrently with a short timeout, so one hung engine costs one timeout, not one per pod.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .args import PORT
from .autoscaler import Observation, PodLoad
from .manifests import CONTAINER

WAITING = "tokenmill_num_requests_waiting"
RUNNING = "tokenmill_num_requests_running"
TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Target:
    """A ready pod and where its engine serves /metrics."""

    name: str
    url: str


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _port(pod: dict[str, Any]) -> int:
    """The engine container's `http` port (the manifests' PORT unless the pod says otherwise)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            for port in container.get("ports") or []:
                if port.get("name") == "http":
                    return int(port["containerPort"])
    return PORT


def targets(pods: list[dict[str, Any]]) -> tuple[list[Target], int]:
    """The ready pods to scrape, and how many pods are not ready (starting or stopping)."""
    ready, not_ready = [], 0
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if _ready(pod) and ip:
            host = f"[{ip}]" if ":" in ip else ip
            ready.append(Target(pod["metadata"]["name"], f"http://{host}:{_port(pod)}/metrics"))
        else:
            not_ready += 1
    return ready, not_ready


class ScrapeError(Exception):
    """A pod's /metrics could not be read or lacked the queue gauges."""


def parse_load(text: str) -> PodLoad:
    """The queue gauges of one engine's exposition (summed over label sets)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (WAITING, RUNNING):
            values[family.name] = sum(sample.value for sample in family.samples)
    missing = [name for name in (WAITING, RUNNING) if name not in values]
    if missing:
        raise ScrapeError(f"no {' or '.join(missing)} in /metrics")
    return PodLoad(waiting=values[WAITING], running=values[RUNNING])


async def scrape(session: aiohttp.ClientSession, target: Target) -> PodLoad:
    """One pod's load, or ScrapeError."""
    try:
        async with session.get(target.url) as response:
            if response.status != 200:
                raise ScrapeError(f"{target.url}: HTTP {response.status}")
            return parse_load(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise ScrapeError(f"{target.url}: {type(e).__name__} {e}".rstrip()) from None


async def observe(pods: list[dict[str, Any]]) -> tuple[Observation, dict[str, str]]:
    """This interval's observation of an InferenceService's pods, and the failed scrapes
    (pod name: why)."""
    ready, not_ready = targets(pods)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = await asyncio.gather(*(scrape(session, t) for t in ready),
                                       return_exceptions=True)
    loads, failures = [], {}
    for target, result in zip(ready, results, strict=True):
        if isinstance(result, ScrapeError):
            failures[target.name] = str(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            loads.append(result)
    return Observation(tuple(loads), len(ready), not_ready), failures
