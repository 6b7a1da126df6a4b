"""The server under test, and the official openai client pointed at it.

In this process: `server_state` builds a ServerState (loaded unless asked not to),
`running_server` serves one with a real uvicorn server on a loopback port in a background
thread, and `in_process_server` does both and shuts the engine down afterwards. As a
subprocess: `ServeProcess` runs `tokenmill serve`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import uvicorn
from process_support import free_port, serve_command

from tokenmill.engine import EngineConfig
from tokenmill.engine.server.app import create_app
from tokenmill.engine.server.metrics import EngineMetrics
from tokenmill.engine.server.serve import DrainingServer
from tokenmill.engine.server.state import ServerOptions, ServerState


def openai_client(base_url: str, api_key: str = "unused", **kwargs) -> openai.OpenAI:
    """The official client, failing on the first error (no retries hide a bad answer)."""
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, **kwargs)


def async_openai_client(base_url: str, api_key: str = "unused",
                        **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, **kwargs)


def load_metrics(base_url: str) -> dict[str, float]:
    """The server's `tokenmill_model_*` samples by name (what start-up measured)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url + "/metrics", timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("tokenmill_model_")}


def server_state(model: str, name: str | None = None, *, options: dict | None = None,
                 load: bool = True, **engine) -> ServerState:
    """A server's state for `model`, served as `name` (the model's own by default); `options`
    are ServerOptions fields, `engine` EngineConfig fields."""
    name = name or model
    state = ServerState(ServerOptions(served_model_name=name, **(options or {})),
                        EngineConfig(model=model, **engine), EngineMetrics(name))
    if load:
        state.load(show_progress=False)
    return state


@dataclass
class InProcessServer:
    url: str  # http://127.0.0.1:PORT
    state: ServerState
    server: uvicorn.Server
    thread: threading.Thread  # the one that runs `server`

    @functools.cached_property
    def client(self) -> openai.OpenAI:
        return openai_client(f"{self.url}/v1")


@contextlib.contextmanager
def running_server(state: ServerState, draining: bool = False) -> Iterator[InProcessServer]:
    """Serve `state` (whose engine is already loaded) until the block ends. `draining` runs
    tokenmill's own DrainingServer, which stops when the engine loop dies, instead of
    uvicorn's."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(state, load_model=False), log_level="warning")
    server = DrainingServer(config, state) if draining else uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield InProcessServer(f"http://127.0.0.1:{sock.getsockname()[1]}", state, server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextlib.contextmanager
def in_process_server(model: str, name: str | None = None, *, options: dict | None = None,
                      **engine) -> Iterator[InProcessServer]:
    """A loaded server for `model` (arguments as for `server_state`), its engine shut down
    when the block ends."""
    state = server_state(model, name, options=options, **engine)
    try:
        with running_server(state) as server:
            yield server
    finally:
        state.engine.shutdown()


class ServeProcess(subprocess.Popen):
    """`tokenmill serve --model MODEL FLAGS` on 127.0.0.1:`port` (a free one by default), run
    from / with `env` added to this process's environment. stdout is dropped; stderr is kept
    (text) for the test to read. A test serving HTTPS sets `url` to https:// and `verify` to
    an SSL context that trusts its certificate."""

    verify: ssl.SSLContext | bool = True

    def __init__(self, model: str, *flags: str, port: int | None = None,
                 env: dict[str, str] | None = None, model_flag: str | None = "--model"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            serve_command(*filter(None, [model_flag, model]), "--host", "127.0.0.1", "--port",
                          str(self.port), *flags),
            cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )

    @classmethod
    def positional(cls, model: str, *flags: str, **kwargs) -> ServeProcess:
        """`tokenmill serve MODEL FLAGS`, the model as vLLM's `vllm serve MODEL` takes it."""
        return cls(model, *flags, model_flag=None, **kwargs)

    def wait_healthy(self, timeout: float) -> None:
        """Return once /health answers 200; fail with the server's stderr if it exits first."""
        deadline = time.monotonic() + timeout
        while True:
            if self.poll() is not None:
                pytest.fail(f"server exited {self.returncode}: {self.stderr.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2,
                             verify=self.verify).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.2)

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """The exit status and stderr of a server that ends by itself; killed if it has not
        within `timeout` seconds."""
        try:
            _, stderr = self.communicate(timeout=timeout)
        finally:
            if self.poll() is None:
                os.kill(self.pid, signal.SIGKILL)
        return self.returncode, stderr


def stream_chunks(url: str, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed call (`stream: true` added), [DONE] left out."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as reply:
        assert reply.status_code == 200
        return [json.loads(line[6:]) for line in reply.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


def wait_idle(state: ServerState, timeout: float = 30.0) -> None:
    """Return once the server's engine holds no request (aborted ones included)."""
    deadline = time.monotonic() + timeout
    while state.engine.engine.has_unfinished_requests() or state.engine.num_requests:
        assert time.monotonic() < deadline, "requests did not drain"
        time.sleep(0.05)
