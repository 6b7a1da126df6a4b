"""The serving benchmark's numbers: per-request records, the summary, and the human table.

Throughput divides by the whole run (first send to last completion) and counts only successful
requests; latency distributions are over successful requests, ITL over all their token gaps.
Input tokens are the server's usage count where it gave one, else the known prompt length.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from tokenmill.engine.bench.report import distribution
from tokenmill.engine.bench.serve_client import RequestResult
from tokenmill.engine.bench.serve_dataset import ServePrompt

MAX_ERROR_ROWS = 5
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E latency"))


def latency_stats(values: list[float]) -> dict[str, float] | None:
    """Mean, P50, P90, P99; None when nothing was measured."""
    if not values:
        return None
    d = distribution(values)
    return {"mean": d["mean"], "p50": d["p50"], "p90": float(np.percentile(values, 90)),
            "p99": d["p99"]}


def request_records(prompts: list[ServePrompt], results: list[RequestResult]) -> list[dict]:
    """One JSON-ready row per request, in workload order."""
    return [{
        "index": i,
        "input_len": p.input_len,
        "prompt_tokens": r.prompt_tokens,
        "max_tokens": p.output_len,
        "output_tokens": r.output_tokens,
        "start_s": r.start_s,
        "ttft_s": r.ttft_s,
        "tpot_s": r.tpot_s,
        "e2e_s": r.e2e_s,
        "itl_s": r.itl_s,
        "error": r.error,
    } for i, (p, r) in enumerate(zip(prompts, results, strict=True))]


def summarize(prompts: list[ServePrompt], results: list[RequestResult],
              duration_s: float) -> dict[str, Any]:
    duration_s = max(duration_s, 1e-9)
    pairs = list(zip(prompts, results, strict=True))
    good = [(p, r) for p, r in pairs if r.ok]
    input_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else (p.input_len or 0)
                       for p, r in good)
    output_tokens = sum(r.output_tokens for _, r in good)
    summary: dict[str, Any] = {
        "completed": len(good),
        "failed": len(pairs) - len(good),
        "errors": dict(Counter(r.error for r in results if not r.ok).most_common()),
        "duration_s": duration_s,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "requests_per_s": len(good) / duration_s,
        "output_tokens_per_s": output_tokens / duration_s,
        "total_tokens_per_s": (input_tokens + output_tokens) / duration_s,
    }
    rs = [r for _, r in good]
    summary["ttft_s"] = latency_stats([r.ttft_s for r in rs if r.ttft_s is not None])
    summary["tpot_s"] = latency_stats([r.tpot_s for r in rs if r.tpot_s is not None])
    summary["itl_s"] = latency_stats([gap for r in rs for gap in r.itl_s])
    summary["e2e_s"] = latency_stats([r.e2e_s for r in rs])
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """Aligned name/value rows, latencies in milliseconds."""
    rows = [
        ("successful requests", str(summary["completed"])),
        ("failed requests", str(summary["failed"])),
        ("duration", f"{summary['duration_s']:.2f} s"),
        ("request throughput", f"{summary['requests_per_s']:.2f} req/s"),
        ("output token throughput", f"{summary['output_tokens_per_s']:.1f} tok/s"),
        ("total token throughput", f"{summary['total_tokens_per_s']:.1f} tok/s"),
        ("input / output tokens", f"{summary['input_tokens']} / {summary['output_tokens']}"),
    ]
    for key, name in LATENCIES:
        d = summary[key]
        value = ("n/a" if d is None else
                 " / ".join(f"{d[q] * 1000:.1f}" for q in ("mean", "p50", "p90", "p99")) + " ms")
        rows.append((f"{name} mean / P50 / P90 / P99", value))
    errors = list(summary["errors"].items())
    rows += [(f"error x{count}", error) for error, count in errors[:MAX_ERROR_ROWS]]
    if len(errors) > MAX_ERROR_ROWS:
        rows.append(("other errors", f"{len(errors) - MAX_ERROR_ROWS} more kinds (see the JSON)"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
