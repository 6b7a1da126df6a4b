"""What a preemption costs, resumed three ways: recomputed from its tokens (no prefix cache),
from what the device's prefix cache still holds, and from the prefix cache with its host tier.

The same workload runs on one engine per mode, one after the other in one process (ab.per_mode),
at the same device pool, which should be small enough for the workload to preempt
(--kv-cache-memory). The modes' steps differ (a resumed sequence prefills less), so they cannot
be paired step by step. For each mode: output tokens/s, preemptions, and where the tokens the
preempted sequences had computed came from at readmission.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.engine_run import EngineRun
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig

GIB = 1 << 30
DEFAULT_POOLS_IN_TIER = 4  # host tier, when --kv-offloading-size is not given: 4 device pools
MODES = ("recompute", "prefix-cache", "host-tier")


def mode_configs(config: EngineConfig) -> dict[str, EngineConfig]:
    tier = config.kv_offloading_size or (
        DEFAULT_POOLS_IN_TIER * (config.kv_cache_memory or GIB) / GIB)
    return {
        "recompute": config.replace(enable_prefix_caching=False, kv_offloading_size=0.0),
        "prefix-cache": config.replace(enable_prefix_caching=True, kv_offloading_size=0.0),
        "host-tier": config.replace(enable_prefix_caching=True, kv_offloading_size=tier),
    }


def measure(config: EngineConfig, llm: Any,
            run_workload: Callable[[], EngineRun]) -> dict[str, Any]:
    scheduler = llm.engine.scheduler
    before = dataclasses.asdict(scheduler.resumed_tokens)
    result = run_workload()
    after = dataclasses.asdict(scheduler.resumed_tokens)
    return {
        **ab.throughput(result),
        "num_preemptions": result.num_preemptions,
        "resumed_tokens": {key: after[key] - before[key] for key in after},
        "kv_offloading_size_gib": config.kv_offloading_size,
    }


def compare(config: EngineConfig, workload: list[BenchRequest],
            show_progress: bool) -> dict[str, Any]:
    configs = mode_configs(config)
    runs = dict(zip(MODES, ab.per_mode([configs[m] for m in MODES], workload, show_progress,
                                       measure), strict=True))
    return {"method": "one engine per mode, run one after the other on the same workload",
            "kv_cache_memory": config.kv_cache_memory, "modes": runs}


def format_comparison(result: dict[str, Any]) -> str:
    rows = [f"{'preemption':<13} {'tok/s':>8} {'ratio':>6} {'preempt':>7} "
            f"{'redone tok':>10} {'device tok':>10} {'host tok':>9}"]
    for mode, r in result["modes"].items():
        resumed = r["resumed_tokens"]
        rows.append(f"{mode:<13} {r['output_tokens_per_s']:>8.1f} {r['throughput_ratio']:>6.2f} "
                    f"{r['num_preemptions']:>7} {resumed['recomputed']:>10} "
                    f"{resumed['device']:>10} {resumed['host']:>9}")
    return "\n".join(rows)
