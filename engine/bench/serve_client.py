"""One completion request against an OpenAI-compatible server, timed chunk by chunk.

TTFT runs from sending the request to the first chunk that carries text; each later chunk with
text adds one inter-token latency (ITL). The output token count comes from the usage chunk
(`stream_options.include_usage`) when the server sends one, else from the text chunks. A
request not streamed has only its end-to-end latency and its usage. Any failure becomes the
result's `error`: a benchmark records failures, it doesn't stop on them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tokenmill.engine.bench.serve_dataset import ServePrompt

ERROR_BODY_CHARS = 300


@dataclass
class RequestResult:
    """What one request measured; times are perf_counter seconds, start_s from the run's start."""

    error: str | None = None
    start_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; undefined for a single token, or
        without a first token's time (not streamed)."""
        if not self.ok or self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class StreamError(Exception):
    """The server answered 200 but its stream or answer was not a well-formed completion."""


def completion_payload(model: str, prompt: ServePrompt, ignore_eos: bool = True,
                       stream: bool = True) -> dict[str, Any]:
    """Greedy, streamed with usage unless `stream` is False; `ignore_eos` (a vLLM extension)
    pins the length."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompt.prompt,
        "max_tokens": prompt.output_len,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
        "temperature": 0,
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


async def send_request(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                       headers: dict[str, str], run_start: float = 0.0) -> RequestResult:
    """POST one completion and time it; never raises for HTTP, network or stream errors."""
    start = time.perf_counter()
    result = RequestResult(start_s=start - run_start)
    try:
        async with session.post(url, json=payload, headers=headers) as response:
            if response.status != 200:
                body = (await response.text(errors="replace")).strip()
                result.error = f"HTTP {response.status}: {body[:ERROR_BODY_CHARS]}"
                return result
            if payload.get("stream"):
                await _read_stream(response, start, result)
            else:
                _read_whole(await response.json(), start, result)
    except Exception as exc:  # any failure of one request is data, not a crash of the run
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return result


def _read_whole(body: dict[str, Any], start: float, result: RequestResult) -> None:
    """A whole answer: its end-to-end time and its usage."""
    result.e2e_s = time.perf_counter() - start
    usage = body.get("usage")
    if not body.get("choices") or not usage:
        raise StreamError(f"not a completion: {json.dumps(body)[:ERROR_BODY_CHARS]}")
    _take_usage(usage, result)


async def _read_stream(response: aiohttp.ClientResponse, start: float,
                       result: RequestResult) -> None:
    """Read `data: {...}` lines until `data: [DONE]`, filling in the result's timings."""
    last_text_at: float | None = None
    text_chunks = 0
    usage: dict[str, Any] | None = None
    done = False
    async for raw in response.content:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators and `: keep-alive` comments
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            done = True
            break
        now = time.perf_counter()
        chunk = json.loads(data)
        if chunk.get("error"):
            raise StreamError(f"error in stream: {chunk['error']}")
        usage = chunk.get("usage") or usage
        choices = chunk.get("choices") or []
        if choices and choices[0].get("text"):
            if last_text_at is None:
                result.ttft_s = now - start
            else:
                result.itl_s.append(now - last_text_at)
            last_text_at = now
            text_chunks += 1
    result.e2e_s = time.perf_counter() - start
    if not done:
        raise StreamError("stream ended without data: [DONE]")
    if last_text_at is None:
        raise StreamError("stream carried no text")
    if usage:
        _take_usage(usage, result)
    else:
        result.output_tokens = text_chunks


def _take_usage(usage: dict[str, Any], result: RequestResult) -> None:
    result.output_tokens = int(usage["completion_tokens"])
    if usage.get("prompt_tokens") is not None:
        result.prompt_tokens = int(usage["prompt_tokens"])
