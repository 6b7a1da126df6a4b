"""Real engines behind the emulated cluster: the harness plays the Deployment controller and the
kubelet, a load generator plays the clients and the Service.

For each replica the Deployment asks for, `Kubelet` runs the container command the operator
wrote (`tokenmill serve ...`, the model on CPU) on its own loopback address (127.0.0.2,
127.0.0.3, ...), creates the Pod object with that address as its IP, marks it Ready once the
engine's /health answers 200, and keeps the Deployment's status counts. Scaling down sends
SIGTERM (the engine drains) and deletes the Pod. `Load` keeps a number of streams busy, each
sending one streamed completion after another to the ready replicas in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from operator_support import Cluster
from process_support import free_port, serve_command

from tokenmill.engine.bench.serve_client import RequestResult, completion_payload, send_request
from tokenmill.engine.bench.serve_dataset import ServePrompt
from tokenmill.operator.scraper import parse_load

POLL_SECONDS = 0.25
FIRST_ADDRESS = 2  # 127.0.0.1 is everyone's; replicas get 127.0.0.2 and up


@dataclass
class Replica:
    """One engine process and the Pod object that stands for it."""

    pod: str
    host: str
    port: int
    proc: asyncio.subprocess.Process
    started: float
    ready_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Kubelet:
    """Runs one Deployment's replicas as real engines; records its replica counts over time."""

    cluster: Cluster
    namespace: str
    name: str
    log_dir: Path
    replicas: list[Replica] = field(default_factory=list)
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, spec.replicas)
    _ids: itertools.count = field(default_factory=itertools.count)
    _status: dict[str, Any] = field(default_factory=dict)

    @property
    def deployment_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.name}"

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    @property
    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.ready_at is not None]

    def counts(self) -> list[int]:
        """spec.replicas each time it changed."""
        return [n for _, n in self.history]

    async def run(self) -> None:
        """Follow the Deployment until cancelled; stop every engine on the way out."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            try:
                while True:
                    await self._step(http)
                    await asyncio.sleep(POLL_SECONDS)
            finally:
                await asyncio.shield(self._stop_all())

    async def _step(self, http: aiohttp.ClientSession) -> None:
        deployment = await self.cluster.get(self.deployment_path)
        if deployment is None:
            return
        wanted = deployment["spec"].get("replicas", 1)
        if not self.history or self.history[-1][1] != wanted:
            self.history.append((time.monotonic(), wanted))
        while len(self.replicas) < wanted:
            await self._start(deployment)
        while len(self.replicas) > wanted:
            # Like a ReplicaSet: a replica that is not ready goes first, then the newest.
            victim = max(self.replicas, key=lambda r: (r.ready_at is None, r.started))
            await self._stop(victim)
        for replica in self.replicas:
            if replica.proc.returncode is not None:
                raise RuntimeError(f"engine {replica.pod} exited with {replica.proc.returncode}; "
                                   f"see {self.log_dir / replica.pod}.log")
            if replica.ready_at is None and await _healthy(http, replica):
                replica.ready_at = time.monotonic()
                await self.cluster.request("PATCH", f"{self.pods_path}/{replica.pod}/status",
                                           {"status": _pod_status(replica, ready=True)})
        await self._report(deployment)

    def _address(self) -> str:
        taken = {r.host for r in self.replicas}
        for n in itertools.count(FIRST_ADDRESS):
            if f"127.0.0.{n}" not in taken:
                return f"127.0.0.{n}"
        raise AssertionError("unreachable")

    async def _start(self, deployment: dict[str, Any]) -> None:
        template = deployment["spec"]["template"]
        (container,) = template["spec"]["containers"]
        host = self._address()
        port = free_port(host)
        command = _local_command(container["command"], host, port)
        pod = f"{self.name}-{next(self._ids)}"
        with (self.log_dir / f"{pod}.log").open("w") as out:
            proc = await asyncio.create_subprocess_exec(
                *command, cwd=self.log_dir, stdout=out, stderr=out,
                env={**os.environ, "OMP_NUM_THREADS": "1"})
        replica = Replica(pod, host, port, proc, time.monotonic())
        self.replicas.append(replica)
        await self.cluster.request("POST", self.pods_path, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": self.namespace,
                         "labels": template["metadata"]["labels"]},
            "spec": {"containers": [{**container, "ports": [
                {"name": "http", "containerPort": port, "protocol": "TCP"}]}]},
            "status": _pod_status(replica, ready=False),
        })

    async def _stop(self, replica: Replica) -> None:
        self.replicas.remove(replica)
        await self.cluster.request("DELETE", f"{self.pods_path}/{replica.pod}")
        if replica.proc.returncode is None:
            replica.proc.terminate()  # SIGTERM: the engine drains, then exits

    async def _stop_all(self) -> None:
        procs = [r.proc for r in self.replicas]
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.replicas.clear()

    async def _report(self, deployment: dict[str, Any]) -> None:
        """The Deployment controller's part: status counts as the replicas come and go."""
        n, ready = len(self.replicas), len(self.ready)
        status = {"replicas": n, "updatedReplicas": n, "readyReplicas": ready,
                  "availableReplicas": ready}
        if status != self._status:
            self._status = status
            await self.cluster.request("PATCH", f"{self.deployment_path}/status",
                                       {"status": status})


def _local_command(command: list[str], host: str, port: int) -> list[str]:
    """The operator's container command, run from this Python on `host:port`."""
    assert command[:2] == ["tokenmill", "serve"], command
    args = list(command[2:])
    for flag, value in (("--host", host), ("--port", str(port))):
        args[args.index(flag) + 1] = value
    return serve_command(*args)


def _pod_status(replica: Replica, ready: bool) -> dict[str, Any]:
    return {"phase": "Running", "podIP": replica.host, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}


async def _healthy(http: aiohttp.ClientSession, replica: Replica) -> bool:
    try:
        async with http.get(f"{replica.url}/health") as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def queue(replicas: list[Replica]) -> tuple[float, float]:
    """(waiting, running) summed over the replicas' /metrics, as the operator reads them."""
    waiting = running = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        for replica in replicas:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(f"{replica.url}/metrics") as response:
                    load = parse_load(await response.text())
                    waiting += load.waiting
                    running += load.running
    return waiting, running


@dataclass(frozen=True)
class Sent:
    """One finished request: its timings, when it ended (from the load's t0), and its pod."""

    result: RequestResult
    end_s: float
    pod: str


@dataclass
class Load:
    """`streams` clients, each sending streamed completions back to back to the ready replicas
    in turn (the Service's part); results keep their start times relative to `t0`."""

    kubelet: Kubelet
    model: str
    max_tokens: int = 24
    prompt: str = "Write a short story about a lighthouse keeper."
    t0: float = field(default_factory=time.perf_counter)
    results: list[Sent] = field(default_factory=list)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _turn: itertools.count = field(default_factory=itertools.count)

    @property
    def streams(self) -> int:
        return len(self._tasks)

    async def set_streams(self, n: int) -> None:
        """Open or close streams until `n` are open; a closed stream aborts its request."""
        while len(self._tasks) < n:
            self._tasks.append(asyncio.create_task(self._stream()))
        while len(self._tasks) > n:
            task = self._tasks.pop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _stream(self) -> None:
        payload = completion_payload(self.model, ServePrompt(self.prompt, self.max_tokens))
        timeout = aiohttp.ClientTimeout(total=600)
        # A connection per request: a kept-alive one that sat idle while the other replicas
        # served this stream may be closed by the server just as the next request goes out
        # (uvicorn's keep-alive timeout), which would read as a failed request.
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            while True:
                ready = self.kubelet.ready
                if not ready:
                    await asyncio.sleep(POLL_SECONDS)
                    continue
                replica = ready[next(self._turn) % len(ready)]
                result = await send_request(http, f"{replica.url}/v1/completions", payload, {},
                                            run_start=self.t0)
                self.results.append(Sent(result, time.perf_counter() - self.t0, replica.pod))
                if not result.ok:
                    await asyncio.sleep(POLL_SECONDS)  # a replica going away: try the next
