"""`tokenmill run-batch`: OpenAI's batch file format, run offline (vLLM's `vllm run-batch`).

Each input line is `{"custom_id", "method": "POST", "url", "body"}`; each output line, in the
input's order, is `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}`. Every request goes through the server's own routes, in process (no socket), so a
batch line is validated, templated, parsed and answered exactly as over HTTP; all lines run
concurrently and the engine batches them. A file that is not a batch file (or repeats a
custom_id, which OpenAI's format forbids) is refused before the model loads, naming its line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from typing import Any

import httpx
from tqdm import tqdm

from tokenmill.engine.contract.config import ConfigError

# The routes a batch line may name (vLLM's, and the completions vLLM's API also serves).
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
              "/v1/score", "/v1/rerank", "/v1/classify")


def read_batch(path: str) -> list[dict[str, Any]]:
    """The batch file's requests; ConfigError naming the line where one is not a request."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError("--input-file", f"can't read {path}: {exc}") from None
    requests: list[dict[str, Any]] = []
    lines_of: dict[str, int] = {}
    for number, data in enumerate(raw.splitlines(), 1):
        where = f"{path}:{number}"
        try:  # a BOM (Windows editors write one) is no part of the first line
            line = data.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError("--input-file", f"{where}: not UTF-8 ({exc.reason} at byte "
                                              f"{exc.start})") from None
        if line.strip():
            item = _request(line, where)
            first = lines_of.setdefault(item["custom_id"], number)
            if first != number:
                raise ConfigError("--input-file", f"{where}: custom_id {item['custom_id']!r} "
                                                  f"is line {first}'s too; each must be unique")
            requests.append(item)
    if not requests:
        raise ConfigError("--input-file", f"{path} holds no requests")
    return requests


def _request(line: str, where: str) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ConfigError("--input-file", f"{where}: not JSON ({exc})") from None
    if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str):
        raise ConfigError("--input-file", f"{where}: needs a custom_id string")
    if item.get("method", "POST") != "POST":
        raise ConfigError("--input-file", f"{where}: method must be POST")
    if item.get("url") not in BATCH_URLS:
        raise ConfigError("--input-file", f"{where}: url {item.get('url')!r} is not one "
                                          f"of {', '.join(BATCH_URLS)}")
    if not isinstance(item.get("body"), dict):
        raise ConfigError("--input-file", f"{where}: body must be a JSON object")
    if item["body"].get("stream"):
        raise ConfigError("--input-file", f"{where}: a batch line cannot stream")
    return item


def check_output_file(path: str) -> None:
    """ConfigError unless `path` can be written: found out after the run, every answer
    would be lost."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError("--output-file", f"{folder} is not a directory")
    if os.path.isdir(path):
        raise ConfigError("--output-file", f"{path} is a directory")
    target = path if os.path.exists(path) else folder
    if not os.access(target, os.W_OK):
        raise ConfigError("--output-file", f"{target} is not writable")


async def run_requests(app: Any, requests: list[dict[str, Any]], concurrency: int,
                       show_progress: bool = True) -> list[dict[str, Any]]:
    """Each request answered by `app` (an ASGI app), as output lines in input order."""
    gate = asyncio.Semaphore(concurrency)
    transport = httpx.ASGITransport(app=app)
    progress = tqdm(total=len(requests), desc="Running batch", unit="req",
                    disable=not show_progress)
    async with httpx.AsyncClient(transport=transport, base_url="http://batch",
                                 timeout=None) as client:

        async def answer(item: dict[str, Any]) -> dict[str, Any]:
            # Sent as JSON text, NaN and lone surrogates kept as Python's parser read them:
            # the server's own parser answers such a body with its 400, as over HTTP.
            content = json.dumps(item["body"])
            async with gate:
                reply = await client.post(item["url"], content=content,
                                          headers={"content-type": "application/json"})
            progress.update(1)
            return _output_line(item["custom_id"], reply)

        try:
            return list(await asyncio.gather(*(answer(item) for item in requests)))
        finally:
            progress.close()


def _output_line(custom_id: str, reply: httpx.Response) -> dict[str, Any]:
    try:
        body = reply.json()
    except ValueError:
        body = {"error": {"message": reply.text}}
    error = None
    if reply.status_code >= 400:
        error = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        error = error or reply.text
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": reply.status_code,
                         "request_id": reply.headers.get("x-request-id") or uuid.uuid4().hex,
                         "body": body},
            "error": error}


def run_batch(config: Any, args: argparse.Namespace) -> int:
    """Load the model, answer every line of --input-file, write --output-file."""
    from tokenmill.engine.contract.server_flags import check_server_flags
    from tokenmill.engine.server.app import create_app
    from tokenmill.engine.server.serve import check_media_path, server_state

    check_server_flags(args)
    check_media_path(args)
    requests = read_batch(args.input_file)
    check_output_file(args.output_file)
    state = server_state(config, args)
    state.options.api_key = None  # in process: no client to authenticate
    # As many calls in flight as the batch holds seats for, twice over; a call of several
    # prompts or n > 1 queues more engine requests than that, and a batch never sheds its own
    # lines with 503s, whatever --max-waiting-requests says for serving.
    concurrency = 2 * config.max_num_seqs  # max_num_seqs is at least 1
    state.options.max_waiting_requests = sys.maxsize
    try:
        state.load(show_progress=True)
        app = create_app(state, load_model=False)

        async def run() -> list[dict[str, Any]]:
            async with app.router.lifespan_context(app):
                return await run_requests(app, requests, concurrency)

        lines = asyncio.run(run())
    finally:
        state.close()
    with open(args.output_file, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    failed = sum(line["error"] is not None for line in lines)
    print(f"{len(lines)} requests, {failed} failed: {args.output_file}", flush=True)
    return 0
