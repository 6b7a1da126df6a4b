"""Throughput at each tensor-parallel size on the offline workload, and what the collectives
cost per step.

Every size runs the same workload on its own engine, one after the other in one process
(ab.per_mode), the first size (normally 1) as the reference. Rank 0 times its all-reduces and
the logits' all-gather (on CUDA each synchronized); that time includes waiting for the slowest
rank, which is the cost a step pays for them. On a CPU the ranks share the cores, so TP > 1 is
expected to be slower there: it shows the overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.engine_run import EngineRun
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig


def parse_sizes(text: str) -> list[int]:
    """'1,2' -> [1, 2]."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 1,2, got {text!r}") from None
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


def measure(config: EngineConfig, llm: Any,
            run_workload: Callable[[], EngineRun]) -> dict[str, Any]:
    """The run's throughput and step time, and the collectives' time on rank 0."""
    tp = llm.engine.tp
    tp.timing, tp.collective_s, tp.collective_calls = True, 0.0, 0
    result = run_workload()
    tp.timing = False
    steps = len(result.steps)
    memory = llm.engine.memory_report()
    return {
        "tensor_parallel_size": config.tensor_parallel_size,
        **ab.throughput(result),
        "steps": steps,
        "step_ms": 1000 * result.elapsed_s / steps,
        "collective_ms_per_step": 1000 * tp.collective_s / steps,
        "collectives_per_step": tp.collective_calls / steps,
        "collective_share": tp.collective_s / result.elapsed_s,
        "kv_capacity_tokens": memory["kv_capacity_tokens"],
        "weights_bytes_rank0": memory["weights_bytes"],
    }


def compare(config: EngineConfig, workload: list[BenchRequest], sizes: list[int],
            show_progress: bool) -> dict[str, Any]:
    runs = ab.per_mode([config.replace(tensor_parallel_size=size) for size in sizes],
                       workload, show_progress, measure)
    return {"method": "one engine per tensor-parallel size, run one after the other on the "
                      "same workload; collective time measured on rank 0",
            "sizes": runs}


def format_comparison(result: dict[str, Any]) -> str:
    rows = [f"{'TP':>3} {'tok/s':>8} {'ratio':>6} {'step ms':>8} {'coll ms/step':>12} "
            f"{'coll share':>10} {'weights MiB (rank 0)':>20}"]
    for r in result["sizes"]:
        rows.append(f"{r['tensor_parallel_size']:>3} {r['output_tokens_per_s']:>8.1f} "
                    f"{r['throughput_ratio']:>6.2f} {r['step_ms']:>8.2f} "
                    f"{r['collective_ms_per_step']:>12.2f} {r['collective_share']:>10.1%} "
                    f"{r['weights_bytes_rank0'] / 2**20:>20.1f}")
    return "\n".join(rows)
