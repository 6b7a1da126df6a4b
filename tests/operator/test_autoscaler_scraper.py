"""The scraper: which pods count, and reading the engine's own metrics exposition over HTTP."""

from __future__ import annotations

import pytest
from aiohttp import web
from operator_support import engine_exposition, http_server
from process_support import free_port

from tokenmill.operator.autoscaler import PodLoad
from tokenmill.operator.scraper import ScrapeError, observe, parse_load, targets


def pod(name, ip="10.0.0.1", ready=True, phase="Running", port=None, deleting=False):
    obj = {"metadata": {"name": name},
           "spec": {"containers": [{"name": "engine", "ports": (
               [{"name": "http", "containerPort": port}] if port else [])}]},
           "status": {"phase": phase, "conditions": [
               {"type": "Ready", "status": "True" if ready else "False"}]}}
    if ip:
        obj["status"]["podIP"] = ip
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


def test_only_ready_running_pods_with_an_ip_are_scraped():
    found, not_ready = targets([
        pod("a"), pod("b", ip="10.0.0.2", port=8123), pod("c", ready=False),
        pod("d", ip=None), pod("e", phase="Pending"), pod("f", deleting=True),
        pod("g", ip="fd00::7"),
    ])
    assert [(t.name, t.url) for t in found] == [
        ("a", "http://10.0.0.1:8000/metrics"), ("b", "http://10.0.0.2:8123/metrics"),
        ("g", "http://[fd00::7]:8000/metrics")]
    assert not_ready == 4


def test_parse_the_engines_exposition():
    assert parse_load(engine_exposition(7, 2)) == PodLoad(waiting=7, running=2)
    with pytest.raises(ScrapeError, match="tokenmill_num_requests_running"):
        parse_load("# TYPE tokenmill_num_requests_waiting gauge\n"
                   "tokenmill_num_requests_waiting 3\n")


@pytest.mark.asyncio
async def test_observe_counts_failures_apart_from_loads():
    async def metrics(request):
        return web.Response(text=engine_exposition(5, 2), content_type="text/plain")

    async def broken(request):
        return web.Response(status=500)

    servers = [await http_server("/metrics", metrics), await http_server("/metrics", broken)]
    runners = [runner for runner, _ in servers]
    ports = [port for _, port in servers]
    try:
        closed = free_port()  # a port nothing listens on
        obs, failures = await observe([
            pod("good", ip="127.0.0.1", port=ports[0]),
            pod("error", ip="127.0.0.1", port=ports[1]),
            pod("down", ip="127.0.0.1", port=closed),
            pod("starting", ip="127.0.0.1", ready=False),
        ])
    finally:
        for runner in runners:
            await runner.cleanup()
    assert obs.loads == (PodLoad(5, 2),)
    assert (obs.ready, obs.not_ready) == (3, 1)
    assert set(failures) == {"error", "down"}
    assert "HTTP 500" in failures["error"]
