"""What the prefix cache costs when it cannot help: the offline workload, cache on against off.

The workload's prompts are random, so no request reuses another's blocks; any difference in
throughput is the cache's own bookkeeping (hashing full blocks, lookups, LRU upkeep). Runs
alternate in ABBA order (off, on, on, off, ...) so a slow drift of the machine falls on both
modes alike; each run builds a fresh engine so neither inherits the other's cache.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from tokenmill.engine.bench import engine_run
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.config import EngineConfig


def run_order(rounds: int) -> list[bool]:
    """Prefix caching per run, ABBA: [False, True, True, False, False, True, ...]."""
    order: list[bool] = []
    for r in range(rounds):
        order += [False, True] if r % 2 == 0 else [True, False]
    return order


def compare(config: EngineConfig, workload: list[BenchRequest], rounds: int,
            show_progress: bool) -> dict[str, Any]:
    """Run the workload `rounds` times per mode; report each run and the median ratio on/off."""
    from tokenmill.engine import LLM

    runs: dict[str, list[float]] = {"cache-on": [], "cache-off": []}
    hits: dict[str, int] = {"cache-on": 0, "cache-off": 0}
    plain_token = workload[0].prompt_token_ids[0]
    for caching in run_order(rounds):
        mode = "cache-on" if caching else "cache-off"
        llm = LLM(**dataclasses.asdict(config.replace(enable_prefix_caching=caching)),
                  show_progress=False)
        engine_run.warm_up(llm, plain_token)
        hits_before = llm.engine.kv.prefix_hits
        result = engine_run.run_engine(llm, workload, show_progress)
        hits[mode] += llm.engine.kv.prefix_hits - hits_before
        llm.engine.kv.allocator.check_all_free()
        output_tokens = sum(r["output_len"] for r in result.requests)
        runs[mode].append(output_tokens / result.elapsed_s)
        del llm
    on, off = statistics.median(runs["cache-on"]), statistics.median(runs["cache-off"])
    return {
        "rounds": rounds,
        "order": ["cache-on" if c else "cache-off" for c in run_order(rounds)],
        "output_tokens_per_s": runs,
        "median_output_tokens_per_s": {"cache-on": on, "cache-off": off},
        "prefix_hit_tokens": hits,
        "ratio_on_off": on / off,
    }


def format_comparison(result: dict[str, Any]) -> str:
    med = result["median_output_tokens_per_s"]
    each = {mode: ", ".join(f"{v:.1f}" for v in values)
            for mode, values in result["output_tokens_per_s"].items()}
    return "\n".join([
        f"prefix cache off tok/s  {med['cache-off']:.1f} (runs: {each['cache-off']})",
        f"prefix cache on tok/s   {med['cache-on']:.1f} (runs: {each['cache-on']})",
        f"cache on / off          {result['ratio_on_off']:.3f} "
        f"(prefix-cache hit tokens: {result['prefix_hit_tokens']['cache-on']})",
    ])
