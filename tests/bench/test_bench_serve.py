"""`tokenmill bench serve` against a tiny fake OpenAI streaming server with known timings.

The server streams one chunk per token after a fixed first delay and a fixed per-token delay,
sends a usage chunk, and answers HTTP 500 to one prompt length, so every number the client
reports can be checked against what the server is known to have done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import threading
from collections import Counter

import pytest
from aiohttp import web
from process_support import free_port

from tokenmill.engine.bench import serve
from tokenmill.engine.bench.serve_dataset import random_prompts, sharegpt_prompts
from tokenmill.engine.bench.serve_load import arrival_times

FIRST_DELAY = 0.05
TOKEN_DELAY = 0.01
MODEL = "fake-model"


class FakeServer:
    """OpenAI streaming completions with controlled delays; records what it was sent."""

    def __init__(self) -> None:
        self.fail_len: int | None = None
        self.send_usage = True
        self.payloads: list[dict] = []
        self.auth: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.payloads.append(payload)
        self.auth.append(request.headers.get("Authorization"))
        prompt = payload["prompt"]
        if len(prompt) == self.fail_len:
            return web.Response(status=500, text="injected failure")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if not payload["stream"]:
                return await self._whole(payload)
            return await self._stream(request, payload)
        finally:
            self.in_flight -= 1

    async def _whole(self, payload: dict) -> web.Response:
        n = payload["max_tokens"]
        await asyncio.sleep(FIRST_DELAY + (n - 1) * TOKEN_DELAY)
        prompt_tokens = _prompt_tokens(payload["prompt"])
        return web.json_response({
            "choices": [{"index": 0, "text": " t" * n, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                      "total_tokens": prompt_tokens + n}})

    async def _stream(self, request: web.Request, payload: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        n = payload["max_tokens"]

        async def event(data: object) -> None:
            text = data if isinstance(data, str) else json.dumps(data)
            await response.write(f"data: {text}\n\n".encode())

        await response.write(b": keep-alive\n\n")
        for i in range(n):
            await asyncio.sleep(FIRST_DELAY if i == 0 else TOKEN_DELAY)
            finish = "length" if i == n - 1 else None
            await event({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": finish}]})
        prompt_tokens = _prompt_tokens(payload["prompt"])
        if self.send_usage:
            await event({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                  "completion_tokens": n,
                                                  "total_tokens": prompt_tokens + n}})
        await event("[DONE]")
        await response.write_eof()
        return response


def _prompt_tokens(prompt: str | list[int]) -> int:
    return len(prompt) if isinstance(prompt, list) else len(prompt.split())


@pytest.fixture
def fake_server():
    server = FakeServer()
    app = web.Application()
    app.router.add_post("/v1/completions", server.completions)
    runner = web.AppRunner(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve_forever() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve_forever, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield server, f"http://127.0.0.1:{sock.getsockname()[1]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(["--model", MODEL, "--no-progress", *argv])


def unique_length_index(prompts) -> int:
    """A request after the first (the warm-up sends the first) whose prompt length is unique."""
    counts = Counter(p.input_len for p in prompts)
    return next(i for i, p in enumerate(prompts) if i and counts[p.input_len] == 1)


def check_ordered(stats: dict) -> None:
    assert stats["p50"] <= stats["p90"] <= stats["p99"]


def test_random_run_matches_the_server(fake_server, tmp_path, capsys):
    server, url = fake_server
    n, input_len, output_len, seed = 12, (8, 64), (3, 8), 5
    prompts = random_prompts(n, input_len, output_len, seed)
    fail = unique_length_index(prompts)
    server.fail_len = prompts[fail].input_len
    path = tmp_path / "serve.json"
    args = parse("--base-url", url + "/", "--num-prompts", str(n), "--input-len", "8:64",
                 "--output-len", "3:8", "--seed", str(seed), "--json", str(path),
                 "--api-key", "s3cret")
    assert serve.run(args) == 0
    out = capsys.readouterr().out
    assert "TTFT mean / P50 / P90 / P99" in out and "HTTP 500: injected failure" in out

    assert len(server.payloads) == n + 1  # the warm-up, then the workload
    sent = server.payloads[1:]
    assert sorted(map(json.dumps, sent)) == sorted(
        json.dumps({"model": MODEL, "prompt": p.prompt, "max_tokens": p.output_len,
                    "stream": True, "stream_options": {"include_usage": True},
                    "temperature": 0, "ignore_eos": True}) for p in prompts)
    assert set(server.auth) == {"Bearer s3cret"}

    text = path.read_text()
    assert "s3cret" not in text
    data = json.loads(text)
    assert data["args"]["request_rate"] == "inf"
    assert {"command", "machine", "git", "server"} <= data.keys()
    summary = data["summary"]
    ok = [p for i, p in enumerate(prompts) if i != fail]
    assert (summary["completed"], summary["failed"]) == (n - 1, 1)
    assert list(summary["errors"]) == ["HTTP 500: injected failure"]
    assert summary["output_tokens"] == sum(p.output_len for p in ok)
    assert summary["input_tokens"] == sum(p.input_len for p in ok)
    assert summary["output_tokens_per_s"] == pytest.approx(
        summary["output_tokens"] / summary["duration_s"])
    assert summary["requests_per_s"] == pytest.approx((n - 1) / summary["duration_s"])

    rows = data["requests"]
    assert [r["index"] for r in rows] == list(range(n))
    assert rows[fail]["error"] == "HTTP 500: injected failure"
    for i, r in enumerate(rows):
        if i == fail:
            continue
        assert r["output_tokens"] == r["max_tokens"] == prompts[i].output_len
        assert r["prompt_tokens"] == r["input_len"] == prompts[i].input_len
        assert len(r["itl_s"]) == r["output_tokens"] - 1
        assert r["ttft_s"] >= FIRST_DELAY
        assert r["e2e_s"] >= FIRST_DELAY + (r["output_tokens"] - 1) * TOKEN_DELAY
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1))
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        check_ordered(summary[key])
    assert summary["ttft_s"]["p50"] >= FIRST_DELAY
    assert summary["tpot_s"]["mean"] >= 0.8 * TOKEN_DELAY
    assert 0.5 * TOKEN_DELAY <= summary["itl_s"]["mean"] < 10 * TOKEN_DELAY


def test_whole_answers_without_streaming_have_end_to_end_latency_only(fake_server, tmp_path):
    server, url = fake_server
    n = 6
    prompts = random_prompts(n, (8, 64), (3, 8), 2)
    path = tmp_path / "whole.json"
    args = parse("--base-url", url, "--num-prompts", str(n), "--input-len", "8:64",
                 "--output-len", "3:8", "--seed", "2", "--no-stream", "--json", str(path))
    assert serve.run(args) == 0
    assert all(p["stream"] is False and "stream_options" not in p for p in server.payloads)
    data = json.loads(path.read_text())
    summary = data["summary"]
    assert (summary["completed"], summary["failed"]) == (n, 0)
    assert summary["output_tokens"] == sum(p.output_len for p in prompts)
    assert summary["ttft_s"] is summary["tpot_s"] is summary["itl_s"] is None
    for r, p in zip(data["requests"], prompts, strict=True):
        assert r["output_tokens"] == p.output_len and r["prompt_tokens"] == p.input_len
        assert r["e2e_s"] >= FIRST_DELAY + (p.output_len - 1) * TOKEN_DELAY
        assert r["ttft_s"] is None and r["itl_s"] == []


def test_concurrency_cap_and_rate_without_usage_or_ignore_eos(fake_server):
    server, url = fake_server
    server.send_usage = False  # token counts must fall back to counting chunks
    args = parse("--base-url", url, "--num-prompts", "8", "--input-len", "4:6",
                 "--output-len", "2:4", "--max-concurrency", "2", "--request-rate", "200",
                 "--no-ignore-eos", "--warmup-requests", "0")
    prompts = serve.load_prompts(args)
    assert serve.run(args) == 0
    assert server.max_in_flight == 2
    assert all("ignore_eos" not in p for p in server.payloads)
    assert sorted(p["max_tokens"] for p in server.payloads) == sorted(
        p.output_len for p in prompts)


def test_sharegpt_prompts_and_run(fake_server, tmp_path, capsys):
    server, url = fake_server
    entries = [{"conversations": [{"from": "human", "value": f"question {i} " * (i + 1)},
                                  {"from": "gpt", "value": "x" * (40 * i)}]} for i in range(6)]
    entries.append({"conversations": [{"from": "gpt", "value": "no human turn"}]})
    entries.append({"id": "no conversations"})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))

    prompts = sharegpt_prompts(str(path), 4, (3, 20), seed=1)
    assert prompts == sharegpt_prompts(str(path), 4, (3, 20), seed=1)
    assert len({p.prompt for p in prompts}) == 4  # drawn without replacement
    for p in prompts:
        i = int(p.prompt.split()[1])
        assert p.output_len == min(max(40 * i // 4, 3), 20)
    assert len(sharegpt_prompts(str(path), 9, (3, 20), seed=1)) == 9  # with replacement

    args = parse("--base-url", url, "--num-prompts", "4", "--dataset", str(path),
                 "--output-len", "3:20", "--seed", "1", "--warmup-requests", "0")
    assert serve.run(args) == 0
    assert re.search(r"^successful requests +4$", capsys.readouterr().out, re.MULTILINE)
    assert sorted(p["prompt"] for p in server.payloads) == sorted(p.prompt for p in prompts)


def test_unreachable_server_counts_failures_without_crashing(capsys):
    port = free_port()  # a port nobody listens on
    args = parse("--base-url", f"http://127.0.0.1:{port}", "--num-prompts", "3",
                 "--input-len", "4", "--output-len", "2", "--warmup-requests", "0")
    assert serve.run(args) == 1
    out = capsys.readouterr().out
    assert "failed requests" in out and "ClientConnectorError" in out
    assert serve.run(parse("--base-url", f"http://127.0.0.1:{port}")) == 1  # warm-up fails
    assert "warm-up request failed" in capsys.readouterr().err


def test_poisson_arrivals_are_seeded():
    a = arrival_times(2000, 50.0, seed=3)
    assert a == arrival_times(2000, 50.0, seed=3) != arrival_times(2000, 50.0, seed=4)
    assert a[0] == 0.0 and a == sorted(a)
    assert a[-1] / (len(a) - 1) == pytest.approx(1 / 50.0, rel=0.1)
    assert arrival_times(5, float("inf"), seed=0) == [0.0] * 5


def test_random_prompts_with_a_tokenizer_avoid_its_special_ids():
    from model_support import SMOLLM2, smollm2_installed

    if not smollm2_installed():
        pytest.skip("needs the built-in SmolLM2")
    args = parse("--base-url", "http://localhost:1/", "--num-prompts", "40", "--input-len",
                 "64", "--output-len", "4", "--seed", "3", "--tokenizer", SMOLLM2)
    prompts = serve.load_prompts(args)
    size, special = serve._vocabulary(SMOLLM2)
    assert size == 49152 and {0, 1, 2} <= special  # <|endoftext|>, <|im_start|>, <|im_end|>
    ids = {i for p in prompts for i in p.prompt}
    assert not ids & special and max(ids) < size and len(ids) > 1000
