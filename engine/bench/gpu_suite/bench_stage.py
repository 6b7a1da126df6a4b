"""The `bench` stage: Llama-3.1-8B shapes on the GPU, each part one JSON file.

Parts, each a workload and the engine modes run on it one after the other (ab.one_mode), the
first mode the reference of the throughput ratios:
  throughput        256 requests, input and output uniform in 100..1024: eager, CUDA graphs,
                    CUDA graphs with async scheduling
  hf                64 requests of the same: the same three modes, then HF generate at batch 64
  batch1            one request, 128 in / 512 out: the same three modes
  throughput-fp8    the 256 requests: bf16, fp8 weights, fp8 KV cache (graphs on)
  batch1-fp8        the batch-1 request: bf16, fp8 weights, fp8 KV cache (graphs on)
  batch1-ngram      the batch-1 request: plain decoding, n-gram speculation (4 tokens)
  throughput-budget the 256 requests, graphs and async scheduling, at a step budget
                    (--max-num-batched-tokens) of 2048 and of 8192 tokens
  kv-offload        multi-turn chat beyond the device pool, the prefix cache without and
                    with its host tier; the tier's block copies against plain pinned copies
  lora              the 64 requests on the base model alone, with LoRA on and unused, and
                    spread over 4 random rank-16 adapters: three engines in lockstep
                    (bench/lora_ab.py), each with a 4 GB KV pool so that all three fit
Every mode's decode steps are set against their bandwidth bound (bytes each step must read
over the device bandwidth, measured once before any engine starts). A dry run cuts every
workload down and runs on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import traceback
from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status
from tokenmill.engine.bench.gpu_suite.suite import selected


@dataclasses.dataclass(frozen=True)
class Workload:
    num_prompts: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]


FULL = {"many": Workload(256, (100, 1024), (100, 1024)), "hf": Workload(64, (100, 1024),
                                                                         (100, 1024)),
        "one": Workload(1, (128, 128), (512, 512))}
DRY = {"many": Workload(6, (8, 40), (8, 40)), "hf": Workload(4, (8, 40), (8, 40)),
       "one": Workload(1, (16, 16), (24, 24))}
HF_BATCH = {False: 64, True: 4}
GRAPHS = {"eager": {"enforce_eager": True}, "cuda-graphs": {"enforce_eager": False},
          "graphs-async": {"enforce_eager": False, "async_scheduling": True}}
PRECISIONS = {"bf16": {}, "fp8": {"quantization": "fp8"}, "kv-fp8": {"kv_cache_dtype": "fp8"}}
SPECULATION = {"plain": {}, "ngram": {"speculative_config": json.dumps(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
     "prompt_lookup_min": 1})}}
BUDGETS = {f"budget-{tokens}": {"enforce_eager": False, "async_scheduling": True,
                                 "max_num_batched_tokens": tokens} for tokens in (2048, 8192)}
# Part -> (workload, modes, HF baseline).
PARTS: dict[str, tuple[str, dict[str, dict[str, Any]], bool]] = {
    "throughput": ("many", GRAPHS, False),
    "hf": ("hf", GRAPHS, True),
    "batch1": ("one", GRAPHS, False),
    "throughput-fp8": ("many", PRECISIONS, False),
    "batch1-fp8": ("one", PRECISIONS, False),
    "batch1-ngram": ("one", SPECULATION, False),
    "throughput-budget": ("many", BUDGETS, False),
}
ALL_PARTS = [*PARTS, "kv-offload", "lora"]
LORA_ADAPTERS = 4
LORA_KV_BYTES = 4_000_000_000  # per engine: three 8B engines side by side on one GPU


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    """Every part named; 1 where a mode failed (the others still ran and were written)."""
    from tokenmill.engine.bench.bandwidth import measure_bandwidth

    parts = selected(ALL_PARTS, args.only)
    check_modes(parts, args.modes)
    model = ctx.model()
    bandwidth = measure_bandwidth(ctx.device)
    status(f"device bandwidth {bandwidth.gb_per_s:.0f} GB/s")
    failed = False
    for part in parts:
        status(f"bench part {part}")
        if part == "kv-offload":
            from tokenmill.engine.bench.gpu_suite import kv_offload_part

            result = kv_offload_part.run(ctx, model)
        elif part == "lora":
            result = lora_part(ctx, model)
        else:
            result = run_part(ctx, model, part, bandwidth, args.modes,
                              write=lambda partial, part=part: ctx.write(f"bench-{part}", partial))
            failed |= bool(result["failed_modes"])
        ctx.write(f"bench-{part}", result)
    return 1 if failed else 0


def base_config(ctx: SuiteContext, model: str) -> Any:
    from tokenmill.engine.contract.config import EngineConfig

    options: dict[str, Any] = {"model": model, "device": ctx.device, "dtype": ctx.dtype}
    if ctx.dry_run:
        options.update(kv_cache_memory=64 << 20, max_num_seqs=8, max_num_batched_tokens=64)
    return EngineConfig(**options)


def run_part(ctx: SuiteContext, model: str, part: str, bandwidth: Any,
             only_modes: str | None = None,
             write: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """The part's modes one after the other. A mode that raises (a CUDA error, memory) is
    recorded under `failed_modes` with its error, and the next mode runs; `write` gets the
    result after each mode, so a run stopped part-way keeps the modes it finished."""
    from tokenmill.engine.bench import ab

    workload_name, modes, with_hf = PARTS[part]
    modes = chosen_modes(part, modes, only_modes)
    spec, workload = _workload(ctx, model, workload_name)
    config = base_config(ctx, model)
    result: dict[str, Any] = {
        "workload": {**dataclasses.asdict(spec),
                     "output_tokens": sum(r.output_len for r in workload),
                     "input_tokens": sum(r.input_len for r in workload)},
        "bandwidth": dataclasses.asdict(bandwidth),
        "engine_config": dataclasses.asdict(config),
        "modes": {},
        "failed_modes": {},
        "pending_modes": list(modes),
    }
    measure = _measure(bandwidth)
    for name, options in modes.items():
        try:
            result["modes"][name] = ab.one_mode(config.replace(**options), workload,
                                                ctx.show_progress, measure)
        except Exception as error:  # noqa: BLE001 - recorded; the part's other modes still run
            traceback.print_exc()
            result["failed_modes"][name] = f"{type(error).__name__}: {error}"
            status(f"mode {name} failed: {result['failed_modes'][name]}")
        result["pending_modes"].remove(name)
        first = result["modes"].get(next(iter(modes)))  # ratios only against the part's first
        if first is not None:
            ab.set_throughput_ratios(result["modes"].values(), first)
        if write is not None:
            write(result)
    if with_hf:
        result["hf"] = _hf_run(ctx, model, workload, HF_BATCH[ctx.dry_run])
        theirs = result["hf"]["output_tokens_per_s"]
        result["ratio_vs_hf"] = {mode: run["output_tokens_per_s"] / theirs
                                 for mode, run in result["modes"].items()}
    return result


def check_modes(parts: list[str], only: str | None) -> None:
    """Before anything runs, SystemExit where --modes names a mode that none of the chosen parts
    has, or where a chosen part has none of the modes named (choose the parts with --only)."""
    if only is None:
        return
    for part in parts:
        if part in PARTS:
            chosen_modes(part, PARTS[part][1], only)
    known = {mode for part in parts if part in PARTS for mode in PARTS[part][1]}
    unknown = sorted(_mode_names(only) - known)
    if unknown:
        raise SystemExit(f"--modes: no part chosen has {unknown}; their modes are "
                         f"{sorted(known)}")


def _mode_names(only: str) -> set[str]:
    return {m.strip() for m in only.split(",") if m.strip()}


def chosen_modes(part: str, modes: dict[str, dict[str, Any]],
                 only: str | None) -> dict[str, dict[str, Any]]:
    """The part's modes that --modes names, in the part's order (all without --modes);
    SystemExit where it names none of them."""
    if only is None:
        return modes
    wanted = _mode_names(only)
    kept = {name: options for name, options in modes.items() if name in wanted}
    if not kept:
        raise SystemExit(f"--modes: part {part} has none of {sorted(wanted)}; its modes are "
                         f"{list(modes)} (choose the parts with --only)")
    return kept


def _workload(ctx: SuiteContext, model: str, name: str) -> tuple[Workload, list[Any]]:
    from tokenmill.engine.bench.offline import special_ids
    from tokenmill.engine.bench.workload import make_workload
    from tokenmill.engine.models.loader import load_tokenizer
    from tokenmill.engine.models.source import resolve_model

    spec = (DRY if ctx.dry_run else FULL)[name]
    tokenizer = load_tokenizer(resolve_model(model))
    return spec, make_workload(spec.num_prompts, spec.input_len, spec.output_len, 0,
                               len(tokenizer), special_ids(tokenizer))


def lora_part(ctx: SuiteContext, model: str) -> dict[str, Any]:
    """What serving LoRA adapters costs at the hf part's load (issue target: the mix within
    20% of the base)."""
    from tokenmill.engine.bench import lora_ab

    spec, workload = _workload(ctx, model, "hf")
    config = base_config(ctx, model)
    if not ctx.dry_run:
        config = config.replace(kv_cache_memory=LORA_KV_BYTES)
    result = lora_ab.compare(config, workload, ctx.show_progress, adapters=LORA_ADAPTERS)
    return {"workload": dataclasses.asdict(spec), "engine_config": dataclasses.asdict(config),
            **result}


def _measure(bandwidth: Any) -> Callable[[Any, Any, Callable[[], Any]], dict[str, Any]]:
    def measure(config: Any, llm: Any, run_workload: Callable[[], Any]) -> dict[str, Any]:
        from tokenmill.engine.bench import ab, decode_bound, engine_run, report

        engine = llm.engine
        graphs = engine.runner.graphs
        replays = graphs.replays if graphs is not None else 0
        memory = engine.memory_report()
        speculation = engine.speculation_stats
        drafts, accepted = speculation.num_draft_tokens, speculation.num_accepted_tokens
        result = run_workload()
        decode = engine_run.decode_steps(result)
        summary = report.summarize(result, [])["tokenmill"]
        return {
            "options": {"enforce_eager": config.enforce_eager,
                        "async_scheduling": config.async_scheduling,
                        "max_num_batched_tokens": config.max_num_batched_tokens,
                        "quantization": config.quantization,
                        "kv_cache_dtype": config.kv_cache_dtype,
                        "speculative_config": config.speculative_config},
            "speculation": {"draft_tokens": speculation.num_draft_tokens - drafts,
                            "accepted_tokens": speculation.num_accepted_tokens - accepted},
            **ab.throughput(result),
            "ttft_s": summary["ttft_s"],
            "num_steps": summary["num_steps"],
            "num_preemptions": result.num_preemptions,
            "kv_peak_usage": summary["kv_cache"]["peak_usage"],
            "graphs_captured": graphs is not None,
            "graph_replays": (graphs.replays - replays) if graphs is not None else 0,
            "decode_steps": len(decode),
            "decode_step_ms_p50": (1000 * statistics.median(s.step_s for s in decode)
                                   if decode else None),
            "decode_bound": decode_bound.summarize(decode, memory["step_weights_bytes"],
                                                   memory["kv_bytes_per_token"] or 0,
                                                   bandwidth),
            "time_split": time_split(result.steps, result.elapsed_s),
            "stats_overhead_s": result.stats_overhead_s,
            "memory": memory,
        }

    return measure


def time_split(steps: list[Any], elapsed_s: float) -> dict[str, Any]:
    """Where a run's time went: decode-only steps, the other steps (prefill chunks, with the
    decodes that share them), and the time between steps; decode steps' spread (a median hides
    the slow ones that a sum counts)."""
    other = [s.step_s for s in steps if not s.decode_batch]
    times = sorted(s.step_s for s in steps if s.decode_batch)

    def quantile(q: float) -> float | None:
        return 1000 * times[min(len(times) - 1, int(q * len(times)))] if times else None

    return {"decode_steps_s": sum(times), "other_steps": len(other), "other_steps_s": sum(other),
            "between_steps_s": elapsed_s - sum(times) - sum(other),
            "decode_step_ms": {"p50": quantile(0.5), "p90": quantile(0.9),
                               "p99": quantile(0.99), "max": quantile(1.0)},
            "other_step_ms_max": 1000 * max(other) if other else None}


def _hf_run(ctx: SuiteContext, model: str, workload: list[Any], batch: int) -> dict[str, Any]:
    import torch

    from tokenmill.engine.bench import hf_baseline

    status(f"HF generate at batch {batch}")
    hf = hf_baseline.load_hf_model(model, getattr(torch, ctx.dtype)).to(ctx.device)
    hf_baseline.warm_up(hf, workload[0].prompt_token_ids[0])
    run = hf_baseline.run_hf(hf, workload, batch, ctx.show_progress)
    del hf
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
    return {"batch_size": batch, "elapsed_s": run.elapsed_s,
            "output_tokens": run.output_tokens,
            "output_tokens_per_s": run.output_tokens_per_s}
