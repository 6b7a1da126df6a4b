"""The offline workload with async scheduling off and on, as a ratio.

Both engines run the same workload one after the other in one process (ab.per_mode), the
synchronous one first. On a CPU the device is the host: nothing overlaps, and the ratio
measures only the bookkeeping async scheduling adds (and noise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.engine_run import EngineRun
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig


def measure(config: EngineConfig, llm: Any,
            run_workload: Callable[[], EngineRun]) -> dict[str, Any]:
    """The run's throughput, steps, and the median engine call of its decode steps."""
    result = run_workload()
    return {
        "async_scheduling": config.async_scheduling,
        "device": str(llm.engine.device),
        **ab.throughput(result),
        "num_steps": len(result.steps),
        **ab.decode_figures(result),
    }


def compare(config: EngineConfig, workload: list[BenchRequest],
            show_progress: bool) -> dict[str, Any]:
    runs = ab.per_mode([config.replace(async_scheduling=on) for on in (False, True)],
                       workload, show_progress, measure)
    return {"method": "one engine without async scheduling, then one with it, on the same "
                      "workload", "runs": runs}


def format_comparison(result: dict[str, Any]) -> str:
    rows = [f"{'mode':<18} {'tok/s':>8} {'ratio':>6} {'decode p50 ms':>13} {'steps':>6}"]
    for r in result["runs"]:
        mode = "async scheduling" if r["async_scheduling"] else "synchronous"
        p50 = r["decode_step_ms_p50"]
        rows.append(f"{mode:<18} {r['output_tokens_per_s']:>8.1f} {r['throughput_ratio']:>6.2f} "
                    f"{'-' if p50 is None else f'{p50:.2f}':>13} {r['num_steps']:>6}")
    if result["runs"] and result["runs"][0]["device"] == "cpu":
        rows.append("(on a CPU the device is the host: nothing overlaps)")
    return "\n".join(rows)
