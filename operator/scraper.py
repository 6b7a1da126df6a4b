"""Reads the engines' queues: the ready pods of an InferenceService and their /metrics.

Which pods count is decided here from the Pod objects (ready, with an IP); what their numbers
mean for the replica count is decided by the policy in autoscaler.py. Scrapes of all pods run
concurrently with a short timeout, so one hung engine costs one timeout, not one per pod.
The pods that run but are not ready are asked for their /health reason the same way, for the
status (pods.py).
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
# 1 per LoRA adapter the engine has loaded, labelled by its name: what a router reads to send
# an adapter's requests to the pods holding it, and what status.adapters reports as Loaded.
ADAPTER_INFO = "tokenmill_lora_adapter_info"
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


def _url(pod: dict[str, Any], path: str) -> str:
    """`path` on the pod's engine, by IP (IPv6 in brackets)."""
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{_port(pod)}{path}"


def targets(pods: list[dict[str, Any]]) -> tuple[list[Target], int]:
    """The ready pods to scrape, and how many pods are not ready (starting or stopping)."""
    ready, not_ready = [], 0
    for pod in pods:
        if _ready(pod) and (pod.get("status") or {}).get("podIP"):
            ready.append(Target(pod["metadata"]["name"], _url(pod, "/metrics")))
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


def parse_adapters(text: str) -> frozenset[str]:
    """The adapters one engine's exposition reports loaded (ADAPTER_INFO at 1). Matched by
    sample name, so an info-typed family (named without `_info`) reads the same as a gauge."""
    return frozenset(
        sample.labels["adapter"] for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == ADAPTER_INFO and sample.value > 0 and "adapter" in sample.labels)


async def _fetch(session: aiohttp.ClientSession, target: Target, parse: Any) -> Any:
    """`parse` of one pod's /metrics text, or ScrapeError."""
    try:
        async with session.get(target.url) as response:
            if response.status != 200:
                raise ScrapeError(f"{target.url}: HTTP {response.status}")
            return parse(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise ScrapeError(f"{target.url}: {type(e).__name__} {e}".rstrip()) from None


async def scrape(session: aiohttp.ClientSession, target: Target) -> PodLoad:
    """One pod's load, or ScrapeError."""
    return await _fetch(session, target, parse_load)


async def loaded_adapters(pods: list[dict[str, Any]]) -> tuple[dict[str, frozenset[str]], int]:
    """Ready pod name -> the adapters its engine reports loaded, for the pods that answered,
    and how many pods are ready; all asked at once, like the autoscaler's scrape."""
    ready, _ = targets(pods)
    if not ready:
        return {}, 0
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = await asyncio.gather(*(_fetch(session, t, parse_adapters) for t in ready),
                                       return_exceptions=True)
    loaded = {}
    for target, result in zip(ready, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, ScrapeError):
            raise result
        if not isinstance(result, BaseException):
            loaded[target.name] = result
    return loaded, len(ready)


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


def _asks_health(pod: dict[str, Any]) -> bool:
    """Running with an IP and its engine container up, yet not Ready: /health says why."""
    status = pod.get("status") or {}
    if _ready(pod) or pod.get("metadata", {}).get("deletionTimestamp") or not status.get("podIP"):
        return False
    return status.get("phase") == "Running" and any(
        c.get("name") == CONTAINER and (c.get("state") or {}).get("running") is not None
        for c in status.get("containerStatuses") or [])


async def _health(session: aiohttp.ClientSession, url: str) -> str | None:
    """The engine's /health reason; None when it answers ok (the readiness probe lags)."""
    try:
        async with session.get(url) as response:
            if response.status == 200:
                return None
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
            if isinstance(body, dict) and isinstance(body.get("status"), str):
                return body["status"]
            return f"/health answered HTTP {response.status}"
    except TimeoutError:
        return f"/health did not answer within {TIMEOUT_SECONDS:g}s"
    except aiohttp.ClientError as e:
        return f"/health unreachable: {type(e).__name__}"


async def health_reasons(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> why its engine says it is not ready ("loading", "model failed to load:
    ..."), for the pods that run but are not Ready; all asked at once, like the scrape."""
    asked = [p for p in pods if _asks_health(p)]
    if not asked:
        return {}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        answers = await asyncio.gather(*(_health(session, _url(p, "/health")) for p in asked))
    return {p["metadata"]["name"]: answer
            for p, answer in zip(asked, answers, strict=True) if answer is not None}
