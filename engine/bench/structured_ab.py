"""What structured outputs cost: the offline workload free, and with a JSON schema on a fraction
of its requests, on two engines stepped side by side.

The constrained requests follow workload.bench_schema, which cannot be complete before their
output length, so every one of their tokens is masked and they end at the same length as in
the free run: both engines take the same steps with the same batches, and each constrained
step pays for filling the bitmask of every constrained row, copying and applying it, and
advancing the matchers. The order within each pair of steps alternates, so the machine's drift
falls on both alike (ab.lockstep). The schema compiles once, before the timed steps.
"""

from __future__ import annotations

import time
from typing import Any

from tokenmill.engine.bench import ab, engine_run
from tokenmill.engine.bench.workload import BenchRequest, with_json_schema
from tokenmill.engine.contract.config import EngineConfig

MODES = ("free", "schema")


def compare(config: EngineConfig, workload: list[BenchRequest], fraction: float,
            show_progress: bool) -> dict[str, Any]:
    """Step both engines in lockstep; each mode's output tok/s and the ratio schema/free."""
    workloads = {"free": workload, "schema": with_json_schema(workload, fraction)}
    engines = ab.start_engines({mode: config for mode in MODES}, workload)
    constrained = [r for r in workloads["schema"] if r.json_schema is not None]
    if constrained:  # compile outside the timed steps (a server compiles off the engine loop)
        start = time.perf_counter()
        engines["schema"].structured.compile(
            engine_run.params_for(constrained[0]).structured_outputs)
        compile_s = time.perf_counter() - start
    run = ab.lockstep(engines, workloads, "structured outputs free/schema", show_progress)
    output_tokens = sum(r.output_len for r in workload)
    constrained_tokens = sum(r.output_len for r in constrained)
    rates = run.output_tokens_per_s(output_tokens)
    busy = run.step_time_s
    return {
        "method": ab.LOCKSTEP_METHOD,
        "fraction": fraction,
        "constrained_requests": len(constrained),
        "schema": constrained[0].json_schema if constrained else None,
        "compile_s": compile_s if constrained else 0.0,
        "output_tokens": output_tokens,
        "constrained_tokens": constrained_tokens,
        "steps": run.steps,
        "step_time_s": busy,
        "output_tokens_per_s": rates,
        "ratio_schema_free": rates["schema"] / rates["free"],
        "extra_us_per_constrained_token": ((busy["schema"] - busy["free"])
                                           / max(constrained_tokens, 1) * 1e6),
    }


def format_comparison(result: dict[str, Any]) -> str:
    rates, steps = result["output_tokens_per_s"], result["steps"]
    return "\n".join([
        f"free tok/s              {rates['free']:.1f} ({steps['free']} steps)",
        f"schema tok/s            {rates['schema']:.1f} ({steps['schema']} steps, "
        f"{result['constrained_requests']} of the requests constrained)",
        f"schema / free           {result['ratio_schema_free']:.3f} "
        f"({result['extra_us_per_constrained_token']:.0f} us more per constrained token)",
    ])
