"""The two shapes of an A/B comparison on the offline workload; each comparison module says only
what differs (its modes, its labels, its extra fields).

- Lockstep: one engine per mode, stepped side by side in one process. Deterministic engines
  given the same requests schedule the same batches, so their steps pair up one for one; the
  order within each pair alternates, so the machine's drift falls on every mode alike. For
  differences of a few percent, which two runs one after the other cannot resolve.
- Per mode: one engine per mode, the whole workload through each, one after the other in one
  process, the first as the reference. For modes whose steps differ (another pool size, another
  number of ranks), which cannot be paired step by step.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from tqdm import tqdm

from tokenmill.engine.bench import engine_run
from tokenmill.engine.bench.engine_run import EngineRun
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig

LOCKSTEP_METHOD = "two engines stepped in lockstep, order alternating per step"

# What a per-mode comparison records of one mode: given the mode's config, its warmed-up LLM and
# a call that runs the workload on it, the run's fields (it measures around the call what the
# call does not report).
Measure = Callable[[EngineConfig, Any, Callable[[], EngineRun]], dict[str, Any]]


@dataclasses.dataclass
class Lockstep:
    """Each mode's count of steps and the time its steps took, in the modes' order."""

    steps: dict[str, int]
    step_time_s: dict[str, float]

    def output_tokens_per_s(self, output_tokens: int) -> dict[str, float]:
        return {mode: output_tokens / busy for mode, busy in self.step_time_s.items()}


def start_engines(configs: dict[str, EngineConfig],
                  workload: list[BenchRequest]) -> dict[str, Any]:
    """One warmed-up engine per mode, kept in the order given (the lockstep order)."""
    from tokenmill.engine import LLM

    engines = {}
    for mode, config in configs.items():
        llm = LLM(**dataclasses.asdict(config), show_progress=False)
        engine_run.warm_up(llm, workload[0].prompt_token_ids)
        engines[mode] = llm.engine
    return engines


def lockstep(engines: dict[str, Any], workloads: dict[str, list[BenchRequest]], desc: str,
             show_progress: bool,
             lora_names: dict[str, list[str | None]] | None = None) -> Lockstep:
    """Each mode's workload on its engine, stepped in pairs whose order alternates; only the
    steps are timed. Every request must produce its output length (ignore_eos) and every KV
    block must be free at the end, or the modes did not do the same work. `lora_names` gives
    each mode's requests their LoRA adapter (None: the base model)."""
    modes = tuple(engines)
    busy = {mode: 0.0 for mode in modes}
    steps = {mode: 0 for mode in modes}
    for mode in modes:
        for i, request in enumerate(workloads[mode]):
            adapter = {"lora_name": lora_names[mode][i]} if lora_names else {}
            engines[mode].add_request(f"ab-{i}", request.prompt_token_ids,
                                      engine_run.params_for(request), **adapter)
    done: dict[str, dict[str, Any]] = {mode: {} for mode in modes}
    bar = tqdm(desc=desc, unit="step", disable=not show_progress)
    pair = 0
    while any(engine.has_unfinished_requests() for engine in engines.values()):
        for mode in modes if pair % 2 == 0 else modes[::-1]:
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
            produced = len(done[mode][f"ab-{i}"].outputs[0].token_ids)
            if produced != request.output_len:
                raise AssertionError(f"{mode} request {i} produced {produced} tokens, asked "
                                     f"for {request.output_len}")
    return Lockstep(steps, busy)


def per_mode(configs: list[EngineConfig], workload: list[BenchRequest], show_progress: bool,
             measure: Measure) -> list[dict[str, Any]]:
    """Each configuration on its own engine over the whole workload, one after the other; every
    run also gets its throughput ratio to the first."""
    runs = [one_mode(config, workload, show_progress, measure) for config in configs]
    set_throughput_ratios(runs, runs[0])
    return runs


def set_throughput_ratios(runs: Iterable[dict[str, Any]], base: dict[str, Any]) -> None:
    """Each run's output tok/s over the base run's, as its throughput_ratio."""
    for run in runs:
        run["throughput_ratio"] = run["output_tokens_per_s"] / base["output_tokens_per_s"]


def one_mode(config: EngineConfig, workload: list[BenchRequest], show_progress: bool,
             measure: Measure) -> dict[str, Any]:
    """One mode's run on an engine of its own. The engine is built here, and what the engines
    before left is given back first: a CUDA engine sizes its KV pool from the memory free, so
    an earlier one still alive (a loop variable holds it while the next is built) would take
    the next one's pool, or leave it none."""
    from tokenmill.engine import LLM

    release_device_memory()
    with LLM(**dataclasses.asdict(config), show_progress=False) as llm:
        engine_run.warm_up(llm, workload[0].prompt_token_ids)
        return measure(config, llm, functools.partial(
            engine_run.run_engine, llm, workload, show_progress))


def release_device_memory() -> None:
    """Free what dead engines left: reference cycles, then the CUDA allocator's cache."""
    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def decode_figures(result: EngineRun) -> dict[str, Any]:
    """A run's pure decode steps: how many, and the median one's milliseconds (None without)."""
    decode = [s.step_s for s in engine_run.decode_steps(result)]
    return {"decode_steps": len(decode),
            "decode_step_ms_p50": 1000 * statistics.median(decode) if decode else None}


def throughput(result: EngineRun) -> dict[str, float]:
    """A run's output tokens/s and elapsed time, as every per-mode comparison reports them."""
    output_tokens = sum(r["output_len"] for r in result.requests)
    return {"output_tokens_per_s": output_tokens / result.elapsed_s,
            "elapsed_s": result.elapsed_s}
