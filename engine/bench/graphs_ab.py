"""The offline workload with decode CUDA graphs off (--enforce-eager) and on, as a ratio.

Both engines run the same workload one after the other in one process, eager first. Where no
graphs are captured (CPU, or the torch attention backend) both runs are eager and the report
says so: the ratio then measures only noise.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from tokenmill.engine.bench import engine_run
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig


def run_mode(config: EngineConfig, workload: list[BenchRequest],
             show_progress: bool) -> dict[str, Any]:
    from tokenmill.engine import LLM

    with LLM(**dataclasses.asdict(config), show_progress=False) as llm:
        engine_run.warm_up(llm, workload[0].prompt_token_ids[0])
        graphs = llm.engine.runner.graphs
        replays_before = graphs.replays if graphs is not None else 0
        result = engine_run.run_engine(llm, workload, show_progress)
        decode = [s.step_s for s in engine_run.decode_steps(result)]
        output_tokens = sum(r["output_len"] for r in result.requests)
        return {
            "enforce_eager": config.enforce_eager,
            "graphs_captured": graphs is not None,
            "graph_batch_sizes": sorted(graphs.graphs) if graphs is not None else [],
            "graph_replays": (graphs.replays - replays_before) if graphs is not None else 0,
            "output_tokens_per_s": output_tokens / result.elapsed_s,
            "elapsed_s": result.elapsed_s,
            "decode_steps": len(decode),
            "decode_step_ms_p50": 1000 * statistics.median(decode) if decode else None,
        }


def compare(config: EngineConfig, workload: list[BenchRequest],
            show_progress: bool) -> dict[str, Any]:
    runs = [run_mode(config.replace(enforce_eager=eager), workload, show_progress)
            for eager in (True, False)]
    base = runs[0]["output_tokens_per_s"]
    for run in runs:
        run["throughput_ratio"] = run["output_tokens_per_s"] / base
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
