"""Decode step time against its bandwidth bound.

A pure decode step (every scheduled sequence feeds one token) reads at least every weight
this rank holds and the KV of every token each sequence attends to. At batch sizes where
compute is cheap, memory traffic is the floor, so the bound is those bytes over the device's
bandwidth, and step / bound says how far the step is from what the memory allows.

Weights are `memory_report()["step_weights_bytes"]`: all of them but an input embedding table
the LM head does not share, of which a step reads only its batch's rows.
KV per token is the pool's `bytes_per_token`: K and V of every layer, scales included.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from tokenmill.engine.bench.bandwidth import Bandwidth


@dataclass(frozen=True)
class DecodeStep:
    """One pure decode step: its wall time, its batch and the tokens its sequences attend to."""

    step_s: float
    batch: int
    context_tokens: int


def step_bytes(weights_bytes: int, kv_bytes_per_token: int, context_tokens: int) -> int:
    """Bytes one decode step must read: the weights once, and each attended token's K and V."""
    return weights_bytes + kv_bytes_per_token * context_tokens


def batch_band(batch: int) -> str:
    """Power-of-two bands: 1, 2, 3-4, 5-8, 9-16, ..."""
    if batch <= 2:
        return str(batch)
    high = 1 << (batch - 1).bit_length()
    return f"{high // 2 + 1}-{high}"


def summarize(steps: list[DecodeStep], weights_bytes: int, kv_bytes_per_token: int,
              bandwidth: Bandwidth) -> dict[str, Any]:
    """Per batch band and over all decode steps: medians of step time, bytes and bound, and the
    median of the per-step ratios step / bound."""
    bands: dict[str, list[DecodeStep]] = {}
    for step in sorted(steps, key=lambda s: s.batch):
        bands.setdefault(batch_band(step.batch), []).append(step)
    return {
        "bandwidth": asdict(bandwidth),
        "weights_bytes": weights_bytes,
        "kv_bytes_per_token": kv_bytes_per_token,
        "bands": {name: _band(group, weights_bytes, kv_bytes_per_token, bandwidth)
                  for name, group in bands.items()},
        "all": _band(steps, weights_bytes, kv_bytes_per_token, bandwidth),
    }


def _band(steps: list[DecodeStep], weights_bytes: int, kv_bytes_per_token: int,
          bandwidth: Bandwidth) -> dict[str, Any]:
    if not steps:
        return {"decode_steps": 0}
    nbytes = [step_bytes(weights_bytes, kv_bytes_per_token, s.context_tokens) for s in steps]
    bounds = [bandwidth.seconds_for(b) for b in nbytes]
    return {
        "decode_steps": len(steps),
        "batch_median": statistics.median(s.batch for s in steps),
        "batch_min": min(s.batch for s in steps),
        "batch_max": max(s.batch for s in steps),
        "context_tokens_median": statistics.median(s.context_tokens for s in steps),
        "bytes_median": statistics.median(nbytes),
        "step_s_median": statistics.median(s.step_s for s in steps),
        "bound_s_median": statistics.median(bounds),
        "ratio_median": statistics.median(s.step_s / b for s, b in zip(steps, bounds,
                                                                       strict=True)),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The human table: one row per batch band, then all decode steps."""
    bw = summary["bandwidth"]
    how = (f"measured on {bw['device']}, best of {bw['repeats']} copies of "
           f"{bw['copy_bytes'] / (1 << 20):.0f} MiB, median {bw['median_gb_per_s']:.1f}"
           if bw["source"] == "measured" else "given")
    lines = [f"decode step vs. bandwidth bound: {bw['gb_per_s']:.1f} GB/s ({how}); weights "
             f"{summary['weights_bytes'] / (1 << 20):.1f} MiB, KV "
             f"{summary['kv_bytes_per_token']} B/token"]
    header = ("batch", "steps", "KV tokens", "step ms", "bound ms", "step/bound")
    rows = [_row(name, band) for name, band in summary["bands"].items()]
    if summary["all"]["decode_steps"]:
        rows.append(_row("all", summary["all"]))
    else:
        rows.append(("all", "0", "-", "-", "-", "-"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def _row(name: str, band: dict[str, Any]) -> tuple[str, ...]:
    return (name, str(band["decode_steps"]), f"{band['context_tokens_median']:.0f}",
            f"{band['step_s_median'] * 1e3:.2f}", f"{band['bound_s_median'] * 1e3:.2f}",
            f"{band['ratio_median']:.2f}x")
