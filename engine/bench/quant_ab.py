"""Throughput and KV capacity of each quantization mode on the offline workload.

Every mode runs the same workload on its own engine with the same KV-cache budget, one after
the other in one process (ab.per_mode), the unquantized engine first: output tokens/s, the
weights' bytes, the tokens the KV pool holds, the most sequences that ran at once, and
preemptions, with each mode's ratio to the unquantized run. The modes' step compositions
differ (a larger pool admits more sequences), so the runs cannot be paired step by step like
the prefix-cache comparison; on a noisy machine, compare ratios of a few percent with care.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.engine_run import EngineRun
from tokenmill.engine.bench.quant_modes import MODES, REFERENCE, REFERENCE_NAME
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig


def measure(config: EngineConfig, llm: Any,
            run_workload: Callable[[], EngineRun]) -> dict[str, Any]:
    """The run's throughput, how many sequences it held at once, and the engine's memory."""
    result = run_workload()
    return {
        **ab.throughput(result),
        "max_running_seqs": max(s.num_running for s in result.steps),
        "num_preemptions": result.num_preemptions,
        **llm.engine.memory_report(),
    }


def compare(config: EngineConfig, workload: list[BenchRequest], modes: list[str],
            show_progress: bool) -> dict[str, Any]:
    """The unquantized engine, then every mode; ratios to the unquantized run."""
    configs = [config.replace(**REFERENCE)] + [config.replace(**MODES[m]) for m in modes]
    runs = dict(zip([REFERENCE_NAME, *modes],
                    ab.per_mode(configs, workload, show_progress, measure), strict=True))
    base = runs[REFERENCE_NAME]
    for result in runs.values():
        result["kv_capacity_ratio"] = result["kv_capacity_tokens"] / base["kv_capacity_tokens"]
        result["weights_ratio"] = result["weights_bytes"] / base["weights_bytes"]
    return {"method": "one engine per mode, run one after the other on the same workload",
            "kv_cache_memory": config.kv_cache_memory, "modes": runs}


def format_comparison(result: dict[str, Any]) -> str:
    rows = [f"{'mode':<14} {'tok/s':>8} {'ratio':>6} {'weights MiB':>11} {'KV tokens':>10} "
            f"{'KV ratio':>8} {'max seqs':>8} {'preempt':>7}"]
    for mode, r in result["modes"].items():
        rows.append(f"{mode:<14} {r['output_tokens_per_s']:>8.1f} {r['throughput_ratio']:>6.2f} "
                    f"{r['weights_bytes'] / 2**20:>11.1f} {r['kv_capacity_tokens']:>10} "
                    f"{r['kv_capacity_ratio']:>8.2f} {r['max_running_seqs']:>8} "
                    f"{r['num_preemptions']:>7}")
    return "\n".join(rows)
