"""What the prefix cache costs when it cannot help: the offline workload, cache on against off.

The workload's prompts are random, so no request reuses another's blocks; any difference in
throughput is the cache's own bookkeeping (hashing full blocks, lookups, LRU upkeep). A
difference of a few percent is below what this machine's drift makes of two identical runs, so
the two engines run side by side in one process, step by step: both get the same requests and,
being deterministic, schedule the same batches, so their steps pair up one for one, and the
order within each pair alternates. Drift then falls on both modes alike, pair by pair.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tqdm import tqdm

from tokenmill.engine.bench import engine_run
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig

MODES = ("cache-off", "cache-on")


def compare(config: EngineConfig, workload: list[BenchRequest],
            show_progress: bool) -> dict[str, Any]:
    """Step both engines in lockstep; report each mode's output tok/s and the ratio on/off."""
    from tokenmill.engine import LLM

    engines = {}
    for mode in MODES:
        llm = LLM(**dataclasses.asdict(config.replace(enable_prefix_caching=mode == "cache-on")),
                  show_progress=False)
        engine_run.warm_up(llm, workload[0].prompt_token_ids[0])
        engines[mode] = llm.engine
    busy = {mode: 0.0 for mode in MODES}
    steps = {mode: 0 for mode in MODES}
    hits_before = {mode: engine.kv.prefix_hits for mode, engine in engines.items()}
    for i, request in enumerate(workload):
        for engine in engines.values():
            engine.add_request(f"ab-{i}", request.prompt_token_ids,
                               engine_run.params_for(request))
    bar = tqdm(desc="prefix cache off/on", unit="step", disable=not show_progress)
    pair = 0
    while any(engine.has_unfinished_requests() for engine in engines.values()):
        order = MODES if pair % 2 == 0 else MODES[::-1]
        for mode in order:
            engine = engines[mode]
            if engine.has_unfinished_requests():
                start = time.perf_counter()
                engine.step()
                busy[mode] += time.perf_counter() - start
                steps[mode] += 1
        pair += 1
        bar.update(1)
    bar.close()
    for engine in engines.values():
        engine.kv.allocator.check_all_free()
    output_tokens = sum(r.output_len for r in workload)
    rates = {mode: output_tokens / busy[mode] for mode in MODES}
    return {
        "method": "two engines stepped in lockstep, order alternating per step",
        "output_tokens": output_tokens,
        "steps": steps,
        "step_time_s": busy,
        "output_tokens_per_s": rates,
        "prefix_hit_tokens": {mode: engines[mode].kv.prefix_hits - hits_before[mode]
                              for mode in MODES},
        "ratio_on_off": rates["cache-on"] / rates["cache-off"],
    }


def format_comparison(result: dict[str, Any]) -> str:
    rates, steps = result["output_tokens_per_s"], result["steps"]
    return "\n".join([
        f"prefix cache off tok/s  {rates['cache-off']:.1f} ({steps['cache-off']} steps)",
        f"prefix cache on tok/s   {rates['cache-on']:.1f} ({steps['cache-on']} steps)",
        f"cache on / off          {result['ratio_on_off']:.3f} "
        f"(prefix-cache hit tokens: {result['prefix_hit_tokens']['cache-on']})",
    ])
