"""The offline workload with decode CUDA graphs off (--enforce-eager) and on, as a ratio.

Both engines run the same workload one after the other in one process (ab.per_mode), eager
first. Where no graphs are captured (CPU, or the torch attention backend) both runs are eager
and the report says so: the ratio then measures only noise.
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
    """The run's throughput, the graphs captured and replayed, and the decode step time."""
    graphs = llm.engine.runner.graphs
    replays_before = graphs.replays if graphs is not None else 0
    result = run_workload()
    return {
        "enforce_eager": config.enforce_eager,
        "graphs_captured": graphs is not None,
        "graph_batch_sizes": sorted(graphs.graphs) if graphs is not None else [],
        "graph_replays": (graphs.replays - replays_before) if graphs is not None else 0,
        **ab.throughput(result),
        **ab.decode_figures(result),
    }


def compare(config: EngineConfig, workload: list[BenchRequest],
            show_progress: bool) -> dict[str, Any]:
    runs = ab.per_mode([config.replace(enforce_eager=eager) for eager in (True, False)],
                       workload, show_progress, measure)
    return {"method": "one engine with --enforce-eager, then one with decode CUDA graphs, on "
                      "the same workload", "runs": runs}


def format_comparison(result: dict[str, Any]) -> str:
    rows = [f"{'mode':<12} {'tok/s':>8} {'ratio':>6} {'decode p50 ms':>13} {'replays':>8}"]
    for r in result["runs"]:
        mode = "eager" if r["enforce_eager"] else (
            "cuda graphs" if r["graphs_captured"] else "eager (no graphs here)")
        p50 = r["decode_step_ms_p50"]
        rows.append(f"{mode:<12} {r['output_tokens_per_s']:>8.1f} {r['throughput_ratio']:>6.2f} "
                    f"{'-' if p50 is None else f'{p50:.2f}':>13} {r['graph_replays']:>8}")
    return "\n".join(rows)
