"""What structured outputs cost: the offline workload free, and with a JSON schema on a fraction
of its requests, on two engines stepped side by side.

The constrained requests follow workload.bench_schema, which cannot be complete before their
output length, so every one of their tokens is masked and they end at the same length as in
the free run: both engines take the same steps with the same batches, and each constrained
step pays for filling the bitmask of every constrained row, copying and applying it, and
advancing the matchers. The order within each pair of steps alternates, so the machine's drift
falls on both alike (as in prefix_ab.py). The schema compiles once, before the timed steps.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tqdm import tqdm

from tokenmill.engine.bench import engine_run
from tokenmill.engine.bench.workload import BenchRequest, with_json_schema
from tokenmill.engine.contract.config import EngineConfig

MODES = ("free", "schema")


def compare(config: EngineConfig, workload: list[BenchRequest], fraction: float,
            show_progress: bool) -> dict[str, Any]:
    """Step both engines in lockstep; each mode's output tok/s and the ratio schema/free."""
    from tokenmill.engine import LLM

    workloads = {"free": workload, "schema": with_json_schema(workload, fraction)}
    engines = {}
    for mode in MODES:
        llm = LLM(**dataclasses.asdict(config), show_progress=False)
        engine_run.warm_up(llm, workload[0].prompt_token_ids[0])
        engines[mode] = llm.engine
    constrained = [r for r in workloads["schema"] if r.json_schema is not None]
    if constrained:  # compile outside the timed steps (a server compiles off the engine loop)
        start = time.perf_counter()
        engines["schema"].structured.compile(
            engine_run.params_for(constrained[0]).structured_outputs)
        compile_s = time.perf_counter() - start
    busy = {mode: 0.0 for mode in MODES}
    steps = {mode: 0 for mode in MODES}
    for mode in MODES:
        for i, request in enumerate(workloads[mode]):
            engines[mode].add_request(f"so-{i}", request.prompt_token_ids,
                                      engine_run.params_for(request))
    done: dict[str, dict[str, Any]] = {mode: {} for mode in MODES}
    bar = tqdm(desc="structured outputs free/schema", unit="step", disable=not show_progress)
    pair = 0
    while any(engine.has_unfinished_requests() for engine in engines.values()):
        order = MODES if pair % 2 == 0 else MODES[::-1]
        for mode in order:
            engine = engines[mode]
            if engine.has_unfinished_requests():
                start = time.perf_counter()
                outputs = engine.step()
                busy[mode] += time.perf_counter() - start
                steps[mode] += 1
                done[mode].update({o.request_id: o for o in outputs if o.finished})
        pair += 1
        bar.update(1)
    bar.close()
    for mode, engine in engines.items():
        engine.kv.allocator.check_all_free()
        for i, request in enumerate(workloads[mode]):
            produced = len(done[mode][f"so-{i}"].outputs[0].token_ids)
            if produced != request.output_len:
                raise AssertionError(f"{mode} request {i} produced {produced} tokens, asked "
                                     f"for {request.output_len}")
    output_tokens = sum(r.output_len for r in workload)
    constrained_tokens = sum(r.output_len for r in constrained)
    rates = {mode: output_tokens / busy[mode] for mode in MODES}
    return {
        "method": "two engines stepped in lockstep, order alternating per step",
        "fraction": fraction,
        "constrained_requests": len(constrained),
        "schema": constrained[0].json_schema if constrained else None,
        "compile_s": compile_s if constrained else 0.0,
        "output_tokens": output_tokens,
        "constrained_tokens": constrained_tokens,
        "steps": steps,
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
