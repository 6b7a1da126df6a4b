"""SIGTERM drains: /health turns 503, new requests get 503, running ones finish or abort."""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
import weakref

import httpx
import pytest
from server_support import ServeProcess, in_process_server


def _start(model_dir: str, shutdown_timeout: float) -> tuple[ServeProcess, str]:
    proc = ServeProcess(model_dir, "--served-model-name", "tiny",
                        "--shutdown-timeout", str(shutdown_timeout))
    proc.wait_healthy(120)
    return proc, proc.url


def _stream_in_background(base: str, max_tokens: int) -> tuple[threading.Thread, dict]:
    result: dict = {"tokens": 0, "started": threading.Event()}

    def run():
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                result["tokens"] += len(choice["token_ids"])
                result["started"].set()
                if choice["finish_reason"]:
                    result["finish_reason"] = choice["finish_reason"]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert result["started"].wait(60)
    return thread, result


@pytest.mark.parametrize("timeout,expected", [(60.0, "length"), (0.5, "abort")])
def test_sigterm_drains_then_exits_zero(tiny_llama_dir, timeout, expected):
    proc, base = _start(tiny_llama_dir, timeout)
    try:
        # Long enough that the stream can't finish inside the 0.5 s timeout on a fast machine.
        thread, result = _stream_in_background(base, max_tokens=300 if timeout > 1 else 1000)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        if expected == "length":
            health = httpx.get(base + "/health", timeout=5)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            refused = httpx.post(base + "/v1/completions", timeout=5,
                                 json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503 and "shutting down" in refused.text
        thread.join(120)
        assert result.get("finish_reason") == expected
        if expected == "length":
            assert result["tokens"] == 300  # a chunk may carry several
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_a_stopped_server_keeps_nothing_of_its_engine_alive(tiny_llama_dir):
    """FastAPI keeps route functions in process-wide caches, so a route that closed over the
    server's state kept its engine (weights and KV pool: 1 GiB on a CPU by default) alive
    after the server stopped, once per server a process ran."""
    with in_process_server(tiny_llama_dir, "t", max_model_len=128, enable_lora=True,
                           allow_runtime_lora_updating=True) as server:
        server.client.completions.create(model="t", prompt="hi", max_tokens=2)
        assert server.client.models.list().data[0].id == "t"
        engine = weakref.ref(server.state.engine.engine)
    del server
    gc.collect()
    assert engine() is None
