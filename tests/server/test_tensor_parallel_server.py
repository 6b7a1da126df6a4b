"""`tokenmill serve --tensor-parallel-size 2`: answers the official openai client, and every
way it can end (SIGTERM, a worker killed, rank 0 killed) leaves no process behind."""

from __future__ import annotations

import os
import signal
import time

import pytest
from process_support import alive, children, gone
from server_support import ServeProcess, openai_client


@pytest.fixture
def tp2_server(tiny_llama_dir):
    proc = ServeProcess(tiny_llama_dir, "--served-model-name", "tiny",
                        "--tensor-parallel-size", "2", "--max-num-seqs", "8", "--block-size", "8")
    proc.wait_healthy(180)
    helpers = children(proc.pid)  # multiprocessing's fork server and resource tracker
    workers = [w for pid in helpers if b"forkserver" in _command_line(pid)
               for w in children(pid)]
    assert len(workers) == 1, {pid: _command_line(pid) for pid in helpers}
    yield proc, proc.url, workers
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    assert gone(helpers, within_s=15)
    for pid in workers:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _command_line(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_answers_the_openai_client_then_sigterm_ends_every_rank(tp2_server):
    proc, base, workers = tp2_server
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


def test_a_killed_worker_brings_the_server_down_with_its_reason(tp2_server):
    proc, base, workers = tp2_server
    os.kill(workers[0], signal.SIGKILL)
    start = time.monotonic()
    code = proc.wait(timeout=30)
    assert time.monotonic() - start < 15
    stderr = proc.stderr.read()
    assert code == 1
    assert f"tensor-parallel worker rank 1 (pid {workers[0]}) was killed by SIGKILL" in stderr


def test_killing_rank_0_ends_its_workers(tp2_server):
    proc, _, workers = tp2_server
    proc.kill()
    proc.wait()
    assert gone(workers, within_s=10)

