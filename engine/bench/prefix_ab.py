"""What the prefix cache costs when it cannot help: the offline workload, cache on against off.

The workload's prompts are random, so no request reuses another's blocks; any difference in
throughput is the cache's own bookkeeping (hashing full blocks, lookups, LRU upkeep). A
difference of a few percent is below what this machine's drift makes of two identical runs, so
the two engines run side by side in one process, step by step (ab.lockstep): both get the same
requests and, being deterministic, schedule the same batches, so their steps pair up one for
one, and the order within each pair alternates. Drift then falls on both modes alike.
"""

from __future__ import annotations

from typing import Any

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig

MODES = ("cache-off", "cache-on")


def compare(config: EngineConfig, workload: list[BenchRequest],
            show_progress: bool) -> dict[str, Any]:
    """Step both engines in lockstep; report each mode's output tok/s and the ratio on/off."""
    engines = ab.start_engines(
        {mode: config.replace(enable_prefix_caching=mode == "cache-on") for mode in MODES},
        workload)
    hits_before = {mode: engine.kv.prefix_hits for mode, engine in engines.items()}
    run = ab.lockstep(engines, {mode: workload for mode in MODES}, "prefix cache off/on",
                      show_progress)
    output_tokens = sum(r.output_len for r in workload)
    rates = run.output_tokens_per_s(output_tokens)
    return {
        "method": ab.LOCKSTEP_METHOD,
        "output_tokens": output_tokens,
        "steps": run.steps,
        "step_time_s": run.step_time_s,
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
