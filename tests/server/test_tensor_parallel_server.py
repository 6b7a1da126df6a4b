"""`tokenmill serve --tensor-parallel-size 2`: answers the official openai client, and every
way it can end (SIGTERM, a worker killed, rank 0 killed) leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from process_support import alive, children, free_port, gone
from server_support import openai_client


def _serve_tp2(model_dir: str) -> tuple[subprocess.Popen, str, list[int]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "tokenmill.engine.cli", "serve", "--model", model_dir,
         "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
         "--tensor-parallel-size", "2", "--max-num-seqs", "8", "--block-size", "8"],
        cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not become healthy"
        time.sleep(0.2)
    workers = children(proc.pid)
    assert len(workers) == 1, workers
    return proc, base, workers


@pytest.fixture
def server(tiny_llama_dir):
    proc, base, workers = _serve_tp2(tiny_llama_dir)
    yield proc, base, workers
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in workers:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_answers_the_openai_client_then_sigterm_ends_every_rank(server):
    proc, base, workers = server
    client = openai_client(base + "/v1")
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8, temperature=0)
    assert chat.choices[0].finish_reason in ("length", "stop")
    assert chat.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time",
                                            max_tokens=8, temperature=0, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    whole = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8,
                                      temperature=0)
    assert streamed == whole.choices[0].text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert gone(workers, within_s=15)


def test_a_killed_worker_brings_the_server_down_with_its_reason(server):
    proc, base, workers = server
    os.kill(workers[0], signal.SIGKILL)
    start = time.monotonic()
    code = proc.wait(timeout=30)
    assert time.monotonic() - start < 15
    stderr = proc.stderr.read()
    assert code == 1
    assert f"tensor-parallel worker rank 1 (pid {workers[0]}) was killed by SIGKILL" in stderr


def test_killing_rank_0_ends_its_workers(server):
    proc, _, workers = server
    proc.kill()
    proc.wait()
    assert gone(workers, within_s=10)

