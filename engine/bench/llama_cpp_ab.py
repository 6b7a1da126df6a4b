"""tokenmill against llama.cpp on the same GGUF file: one stream, then several at once.

Both run in this process on the same file (the built-in SmolLM2 unless --model names another
GGUF), with the same chat-templated prompts as token ids, greedy, every end-of-generation
token banned so that each request emits exactly --output-len tokens. For each stream count N,
N distinct requests: tokenmill takes them all at once (continuous batching); llama.cpp
(llama-cpp-python's `Llama`, whose OpenAI server also serves one sequence at a time) runs them
one after the other. Reported per engine: total output tokens over the wall time from the first
request to the last token, and tokenmill's ratio to llama.cpp. llama.cpp runs with --threads
threads (default: torch's intra-op threads, what tokenmill computes with). Where llama_cpp is
not installed (`pip install llama-cpp-python`, built locally), its side is skipped and said so.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

TOPICS = ("a lighthouse keeper", "the history of bread", "how tides work", "a chess endgame",
          "a city under snow", "the first computers", "bees in winter", "a desert journey")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=_counts, default="1,8,32",
                        help="Comma-separated numbers of concurrent requests (default 1,8,32).")
    parser.add_argument("--output-len", type=int, default=256,
                        help="Tokens each request generates (default 256).")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama.cpp's threads (default: torch's intra-op threads).")
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="Show loading progress and each row as it is measured.")


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive integers")
    return counts


def prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """`count` distinct chat prompts as token ids (topics cycle, numbered past the list)."""
    out = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)] + (f" (part {i // len(TOPICS) + 1})"
                                           if i >= len(TOPICS) else "")
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a long, detailed story about {topic}."}],
            add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def run_tokenmill(llm: Any, requests: list[list[int]], output_len: int) -> dict[str, Any]:
    """All requests submitted at once, stepped until the last finishes."""
    from tokenmill.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [len(o.outputs[0].token_ids) for o in outputs]
    return _result(tokens, seconds)


def open_llama_cpp(path: str, context: int, threads: int) -> Any | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    return Llama(model_path=path, n_ctx=context, n_threads=threads, n_threads_batch=threads,
                 verbose=False)


def run_llama_cpp(llama: Any, requests: list[list[int]], output_len: int,
                  banned: list[int]) -> dict[str, Any]:
    """The requests one after the other, as llama-cpp-python's server serves them."""
    bias = {token: float("-inf") for token in banned}
    tokens = []
    start = time.perf_counter()
    for ids in requests:
        llama.reset()
        out = llama.create_completion(ids, max_tokens=output_len, temperature=0.0,
                                      logit_bias=bias)
        tokens.append(out["usage"]["completion_tokens"])
    return _result(tokens, time.perf_counter() - start)


def _result(tokens: list[int], seconds: float) -> dict[str, Any]:
    return {"requests": len(tokens), "output_tokens": sum(tokens), "seconds": seconds,
            "output_tokens_per_s": sum(tokens) / seconds, "tokens_per_request": tokens}


def end_tokens(tokenizer: Any) -> list[int]:
    """Every special token (EOS, end of turn, ...): llama.cpp stops at any it counts as an end
    of generation, so all of them are banned on its side; tokenmill ignores EOS."""
    return sorted(set(tokenizer.all_special_ids))


def compare(llm: Any, llama: Any | None, streams: list[int], output_len: int,
            progress: bool = True) -> dict[str, Any]:
    tokenizer = llm.tokenizer
    banned = end_tokens(tokenizer)
    warm = prompts(tokenizer, 1)
    run_tokenmill(llm, warm, 8)
    if llama is not None:
        run_llama_cpp(llama, warm, 8, banned)
    cells = []
    for n in streams:
        requests = prompts(tokenizer, n)
        ours = run_tokenmill(llm, requests, output_len)
        theirs = run_llama_cpp(llama, requests, output_len, banned) if llama else None
        cell = {"streams": n, "tokenmill": ours, "llama_cpp": theirs,
                "ratio": (ours["output_tokens_per_s"] / theirs["output_tokens_per_s"]
                          if theirs else None)}
        cells.append(cell)
        if progress:
            print(format_row(cell), file=sys.stderr, flush=True)
    return {"output_len": output_len, "banned_tokens": banned, "cells": cells}


def format_row(cell: dict[str, Any]) -> str:
    theirs = cell["llama_cpp"]
    other = f"{theirs['output_tokens_per_s']:>10.1f}" if theirs else f"{'skipped':>10}"
    ratio = f"{cell['ratio']:>6.2f}x" if cell["ratio"] else f"{'-':>7}"
    return (f"{cell['streams']:>7} {cell['tokenmill']['output_tokens_per_s']:>10.1f} "
            f"{other} {ratio}")


def run(args: argparse.Namespace) -> int:
    import torch

    from tokenmill.engine import LLM
    from tokenmill.engine.bench import report
    from tokenmill.engine.contract.config import engine_config_from_args

    config = engine_config_from_args(args)
    gguf_path = _gguf_path(config.model, config.download_dir)
    if gguf_path is None:
        print("tokenmill bench llama-cpp: --model must be a GGUF file (llama.cpp reads only "
              "GGUF)", file=sys.stderr)
        return 2
    llm = LLM(**dataclasses.asdict(config), show_progress=args.progress)
    threads = args.threads or torch.get_num_threads()
    longest = max(len(p) for p in prompts(llm.tokenizer, max(args.streams)))
    llama = open_llama_cpp(gguf_path, longest + args.output_len + 16, threads)
    if llama is None:
        print("llama_cpp is not installed: its side is skipped (pip install llama-cpp-python)",
              file=sys.stderr)
    print(f"{'streams':>7} {'tokenmill':>10} {'llama.cpp':>10} {'ratio':>7}  (output tok/s)",
          file=sys.stderr)
    result = compare(llm, llama, args.streams, args.output_len, args.progress)
    print(format_table(result))
    if args.json:
        report.write_json(args.json, {
            "benchmark": "llama-cpp", "command": report.command_line(),
            "model_file": gguf_path, "threads": {"llama_cpp": threads,
                                                 "torch": torch.get_num_threads()},
            "llama_cpp_version": _llama_cpp_version(), "engine": {
                "dtype": str(llm.engine.dtype), "quantization": llm.engine.quantization,
                **llm.engine.memory_report()},
            "machine": report.machine_info(config.device), "git": report.git_revision(),
            **result,
        })
        print(f"raw results: {args.json}")
    return 0


def format_table(result: dict[str, Any]) -> str:
    rows = [f"{'streams':>7} {'tokenmill':>10} {'llama.cpp':>10} {'ratio':>7}  (output tok/s, "
            f"{result['output_len']} tokens per request)"]
    rows += [format_row(cell) for cell in result["cells"]]
    return "\n".join(rows)


def _gguf_path(model: str, download_dir: str | None) -> str | None:
    from tokenmill.engine.models.source import resolve_model

    source = resolve_model(model, download_dir)
    return source.gguf_path if source.gguf_file else None


def _llama_cpp_version() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__
