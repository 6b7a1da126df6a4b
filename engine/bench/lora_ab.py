"""What serving LoRA adapters costs: the offline workload on the base model alone, and spread
over N adapters at once, at the same load.

Three engines side by side in one process (ab.lockstep): the base model without LoRA
("base"); the same engine with --enable-lora and its adapters loaded, every request on the base
("lora-idle": what enabling LoRA costs a request that uses none); and every request on one of N
random adapters, round robin ("lora-mix"). With --max-loras N no request waits for a slot, so
the three schedule the same batches and their steps pair up one for one; the order within each
set of steps alternates, so the machine's drift falls on every mode alike. The adapters are
random (speed depends on rank and target modules, not on values), written in PEFT's format.
"""

from __future__ import annotations

import tempfile
from typing import Any

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.random_adapters import ALL_TARGETS, write_random_adapter
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig

MODES = ("base", "lora-idle", "lora-mix")
DEFAULT_RANK = 16  # vLLM's default --max-lora-rank


def compare(config: EngineConfig, workload: list[BenchRequest], show_progress: bool,
            adapters: int, rank: int = DEFAULT_RANK) -> dict[str, Any]:
    """Step the three modes in lockstep; report each mode's output tok/s and the ratios to the
    base."""
    engines = ab.start_engines({"base": config.replace(enable_lora=False, lora_modules=())},
                               workload)
    with tempfile.TemporaryDirectory(prefix="tokenmill-lora-") as directory:
        model_config = engines["base"].model_config
        names = [f"adapter-{i}" for i in range(adapters)]
        paths = [write_random_adapter(f"{directory}/{name}", model_config, rank, seed=i)
                 for i, name in enumerate(names)]
        modules = tuple(f"{name}={path}" for name, path in zip(names, paths, strict=True))
        lora = config.replace(enable_lora=True, lora_modules=modules, max_loras=adapters,
                              max_lora_rank=max(rank, config.max_lora_rank))
        engines.update(ab.start_engines({"lora-idle": lora, "lora-mix": lora}, workload))
        adapter_of = {"base": [None] * len(workload), "lora-idle": [None] * len(workload),
                      "lora-mix": [names[i % adapters] for i in range(len(workload))]}
        loads_before = {mode: _slot_loads(engine) for mode, engine in engines.items()}
        run = ab.lockstep(engines, {mode: workload for mode in MODES},
                          f"LoRA: base, enabled and idle, {adapters} adapters", show_progress,
                          lora_names=adapter_of)
    output_tokens = sum(r.output_len for r in workload)
    rates = run.output_tokens_per_s(output_tokens)
    return {
        "method": ab.LOCKSTEP_METHOD,
        "adapters": adapters,
        "rank": rank,
        "target_modules": list(ALL_TARGETS),
        "output_tokens": output_tokens,
        "steps": run.steps,
        "step_time_s": run.step_time_s,
        "output_tokens_per_s": rates,
        "ratio_to_base": {mode: rates[mode] / rates["base"] for mode in MODES},
        # Adapter weights copied into device slots during the run (each adapter once, when
        # --max-loras holds them all).
        "adapter_slot_loads": {mode: _slot_loads(engines[mode]) - loads_before[mode]
                               for mode in MODES},
    }


def _slot_loads(engine: Any) -> int:
    lora = engine.runner.lora
    return lora.loads if lora is not None else 0


def format_comparison(result: dict[str, Any]) -> str:
    rates, ratios = result["output_tokens_per_s"], result["ratio_to_base"]
    labels = {"base": "base model, no LoRA", "lora-idle": "LoRA on, base requests",
              "lora-mix": f"{result['adapters']} adapters (rank {result['rank']}) mixed"}
    return "\n".join(f"{labels[mode]:<34} {rates[mode]:8.1f} tok/s  {ratios[mode]:.3f}x"
                     for mode in MODES)
