"""Online serving benchmark: streamed completions against any OpenAI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from tokenmill.engine.bench.serve_dataset import ServePrompt
from tokenmill.engine.bench.workload import parse_range

if TYPE_CHECKING:  # the client imports aiohttp: only when a benchmark runs
    from tokenmill.engine.bench.serve_client import RequestResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Server, workload, load shape and report flags."""
    parser.add_argument("--base-url", required=True,
                        help="Server root, e.g. http://127.0.0.1:8000 (no /v1).")
    parser.add_argument("--endpoint", default="/v1/completions",
                        help="Completions path under the base URL (default /v1/completions).")
    parser.add_argument("--model", required=True, help="Model name sent in every request.")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="Bearer token (default $OPENAI_API_KEY); never written to the JSON.")
    parser.add_argument("--num-prompts", type=_positive_int, default=100,
                        help="Requests to send (default 100).")
    parser.add_argument("--request-rate", type=_positive_float, default=math.inf,
                        help="Poisson arrivals per second; inf sends all at once (default inf).")
    parser.add_argument("--max-concurrency", type=_positive_int, default=None,
                        help="At most this many requests in flight (default: no cap).")
    parser.add_argument("--dataset", default="random",
                        help="'random' (token-id prompts) or the path of a ShareGPT JSON file.")
    parser.add_argument("--input-len", type=parse_range, default="32:512",
                        help="Random prompt length range LOW:HIGH, inclusive (default 32:512).")
    parser.add_argument("--output-len", type=parse_range, default="16:256",
                        help="max_tokens range LOW:HIGH: uniform for random, the clip for "
                             "ShareGPT (default 16:256).")
    parser.add_argument("--seed", type=int, default=0,
                        help="Seeds the prompts, lengths and arrivals (default 0).")
    parser.add_argument("--tokenizer", default=None,
                        help="Model dir, .gguf or built-in name whose vocabulary random prompts "
                             "use (exact vocabulary size and special ids).")
    parser.add_argument("--vocab-size", type=_positive_int, default=None,
                        help="Random prompt ids below this, without --tokenizer (default 32000; "
                             "ids below 1000 are avoided).")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="Send ignore_eos (vLLM extension) so outputs run to max_tokens; "
                             "--no-ignore-eos for strict OpenAI servers.")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                        help="Stream each completion and time its chunks (TTFT, ITL); "
                             "--no-stream waits for whole answers (E2E latency and "
                             "throughput only), as batch clients do.")
    parser.add_argument("--warmup-requests", type=int, default=1,
                        help="Untimed requests sent first, one at a time; the run stops if one "
                             "fails (default 1).")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="Seconds one request may take before it counts as failed.")
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="Show a progress bar.")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number or inf, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Send the workload, print the summary, write the JSON; 1 if nothing succeeded."""
    from tokenmill.engine.bench import serve_stats

    try:
        prompts = load_prompts(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    url = args.base_url.rstrip("/") + args.endpoint
    rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}/s"
    print(f"{len(prompts)} requests to {url}, rate {rate}, max concurrency "
          f"{args.max_concurrency or 'none'}", file=sys.stderr, flush=True)
    results, duration, warmup_error = asyncio.run(_benchmark(args, prompts, url))
    if warmup_error is not None:
        print(f"error: warm-up request failed: {warmup_error}", file=sys.stderr)
        return 1
    summary = serve_stats.summarize(prompts, results, duration)
    print(serve_stats.format_summary(summary))
    if args.json:
        write_report(args, url, prompts, results, summary)
        print(f"raw results: {args.json}")
    return 0 if summary["completed"] else 1


def load_prompts(args: argparse.Namespace) -> list[ServePrompt]:
    """The random workload (seeded) or a seeded sample of the ShareGPT file."""
    from tokenmill.engine.bench import serve_dataset

    if args.dataset != "random":
        return serve_dataset.sharegpt_prompts(args.dataset, args.num_prompts, args.output_len,
                                              args.seed)
    vocab_size, special = args.vocab_size, None
    if args.tokenizer:
        vocab_size, special = _vocabulary(args.tokenizer)
    return serve_dataset.random_prompts(args.num_prompts, args.input_len, args.output_len,
                                        args.seed, vocab_size, special)


def _vocabulary(name: str) -> tuple[int, set[int]]:
    """Vocabulary size and special ids of a local tokenizer (never downloaded)."""
    from tokenmill.engine.bench.offline import special_ids
    from tokenmill.engine.models.loader import load_tokenizer
    from tokenmill.engine.models.source import resolve_model

    tokenizer = load_tokenizer(resolve_model(name))
    return len(tokenizer), special_ids(tokenizer)


async def _benchmark(args: argparse.Namespace, prompts: list[ServePrompt],
                     url: str) -> tuple[list[RequestResult], float, str | None]:
    """Warm up, then the timed run; returns (results, duration, warm-up error or None)."""
    import aiohttp
    from tqdm import tqdm

    from tokenmill.engine.bench.serve_client import completion_payload, send_request
    from tokenmill.engine.bench.serve_load import arrival_times, run_load

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    connector = aiohttp.TCPConnector(limit=0)  # the default pool of 100 would cap concurrency
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async def send(prompt: ServePrompt, run_start: float = 0.0) -> RequestResult:
            payload = completion_payload(args.model, prompt, args.ignore_eos, args.stream)
            return await send_request(session, url, payload, headers, run_start)

        for i in range(args.warmup_requests):
            warm = await send(prompts[i % len(prompts)])
            if not warm.ok:
                return [], 0.0, warm.error
        arrivals = arrival_times(len(prompts), args.request_rate, args.seed)
        bar = tqdm(total=len(prompts), desc="requests", unit="req", disable=not args.progress)
        start = time.perf_counter()
        results = await run_load(prompts, lambda p: send(p, start), arrivals,
                                 args.max_concurrency, on_done=lambda _: bar.update(1))
        duration = time.perf_counter() - start
        bar.close()
    return results, duration, None


def write_report(args: argparse.Namespace, url: str, prompts: list[ServePrompt],
                 results: list[RequestResult], summary: dict[str, Any]) -> None:
    """The auditable JSON: command, machine, git revision, server, per-request rows, summary."""
    from tokenmill.engine.bench import report
    from tokenmill.engine.bench.serve_stats import request_records

    command = report.command_line()
    if args.api_key:
        command = command.replace(args.api_key, "<redacted>")
    recorded = {k: v for k, v in vars(args).items() if k not in ("func", "api_key")}
    recorded["request_rate"] = str(args.request_rate)  # JSON has no infinity
    report.write_json(args.json, {
        "benchmark": "serve",
        "command": command,
        "args": recorded,
        "server": {"url": url, "model": args.model},
        "machine": report.machine_info("client"),
        "git": report.git_revision(),
        "summary": summary,
        "requests": request_records(prompts, results),
    })
