"""The `summary` stage: one markdown table from the JSON the other stages wrote, each figure
beside the issue's target where it has one. Parts that have not run are listed as missing."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext

Row = tuple[str, str, str]  # what, measured, target (empty: none)

# The targets.
THROUGHPUT_TARGET = 10_000   # output tok/s on 256 requests
BATCH1_TARGET = 150          # output tok/s at batch 1, bf16
GRAPHS_BATCH1_TARGET = 3.0   # graphs over eager at batch 1
FP8_BATCH1_TARGET = 1.4      # fp8 weights over bf16 at batch 1
LORA_TARGET = 0.8           # 4 adapters mixed over the base model alone (within 20%)
RATIO_TARGETS = {("batch1", "cuda-graphs"): GRAPHS_BATCH1_TARGET,
                 ("batch1-fp8", "fp8"): FP8_BATCH1_TARGET}


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    print(format_table(load(ctx.out_dir, ctx.prefix)))
    return 0


def load(out_dir: Path, prefix: str) -> dict[str, dict[str, Any]]:
    """Every file <prefix>-NAME.json under out_dir, by NAME."""
    return {path.name[len(prefix) + 1:-len(".json")]: json.loads(path.read_text())
            for path in sorted(out_dir.glob(f"{prefix}-*.json"))}


def format_table(files: dict[str, dict[str, Any]]) -> str:
    rows: list[Row] = []
    missing = []
    for name, rows_of in ROWS.items():
        if name in files:
            rows += rows_of(files[name]["result"])
        else:
            missing.append(name)
    lines = ["| what | measured | target |", "| --- | ---: | --- |"]
    lines += [f"| {what} | {measured} | {target} |" for what, measured, target in rows]
    if missing:
        lines.append(f"\nNot run: {', '.join(missing)}.")
    return "\n".join(lines)


def _verdict(value: float, target: float, unit: str = "") -> str:
    return f">= {target:,g}{unit}: {'met' if value >= target else 'missed'}"


def _tests(result: dict[str, Any]) -> list[Row]:
    """Met only where every part's pytest exited 0 with tests run: a pytest that could not
    start (a bad flag, a collection error) counts no failure, and passes nothing."""
    counts = result["counts"]
    return [("tests: passed / failed / errors / skipped",
             f"{counts.get('passed', 0)} / {counts.get('failed', 0)} / "
             f"{counts.get('errors', 0)} / {counts.get('skipped', 0)}",
             "no failure: " + ("met" if result["passed"] else "missed"))]


def _modes(part: str, result: dict[str, Any], targets: dict[str, tuple[float, str]]) -> list[Row]:
    rows = []
    for mode, run in result["modes"].items():
        rate = run["output_tokens_per_s"]
        bound = run["decode_bound"]["all"]
        step = (f"; decode step {bound['step_s_median'] * 1e3:.2f} ms = "
                f"{bound['ratio_median']:.2f}x its bound" if bound["decode_steps"] else "")
        split = run.get("time_split")  # runs before the split was recorded have none
        if split:
            step += (f"; {split['decode_steps_s']:.1f} s in decode steps, "
                     f"{split['other_steps_s']:.1f} s in {split['other_steps']} other steps, "
                     f"{split['between_steps_s']:.1f} s between steps")
        target = targets.get(mode)
        rows.append((f"{part}, {mode}: output tok/s", f"{rate:,.1f}{step}",
                     _verdict(rate, *target) if target else ""))
        first = next(iter(result["modes"]))
        if mode != first and "throughput_ratio" in run:
            ratio = run["throughput_ratio"]
            target = RATIO_TARGETS.get((part, mode))
            rows.append((f"{part}, {mode} / {first}", f"{ratio:.2f}x",
                         _verdict(ratio, target, "x") if target else ""))
    # Results written before a mode could fail or stop part-way have neither key.
    for mode, error in result.get("failed_modes", {}).items():
        first_line = error.splitlines()[0] if error else ""
        rows.append((f"{part}, {mode}", f"failed: {first_line.replace('|', '/')}",
                     "runs: missed"))
    for mode in result.get("pending_modes", []):
        rows.append((f"{part}, {mode}", "not run (the part stopped before it)", ""))
    return rows


def _part(name: str, targets: dict[str, tuple[float, str]] | None = None
          ) -> Callable[[dict[str, Any]], list[Row]]:
    def rows(result: dict[str, Any]) -> list[Row]:
        out = _modes(name, result, targets or {})
        if "ratio_vs_hf" in result:
            hf = result["hf"]
            ratios = ", ".join(f"{mode} {ratio:.2f}x"
                               for mode, ratio in result["ratio_vs_hf"].items())
            out.append((f"{name}: HF generate batch {hf['batch_size']} tok/s",
                        f"{hf['output_tokens_per_s']:,.1f} (tokenmill: {ratios})", ""))
        return out

    return rows


def _kv_offload(result: dict[str, Any]) -> list[Row]:
    summary = result["multiturn"]["summary"]
    copies = result["copies"]
    on = summary["offload-on"]
    return [
        ("kv-offload: later-turn TTFT, host tier off / on",
         f"{summary.get('later_turn_mean_ttft_speedup', float('nan')):.2f}x (hit rate "
         f"{on['device_hit_rate']:.0%} device + {on['host_hit_rate']:.0%} host)", ""),
        ("kv-offload: tier copies to host / to device, GB/s",
         f"{copies['tier_to_host_gb_per_s']:.1f} / {copies['tier_to_device_gb_per_s']:.1f} "
         f"({copies['to_host_ratio']:.0%} / {copies['to_device_ratio']:.0%} of plain pinned "
         "copies)", ""),
    ]


def _lora(result: dict[str, Any]) -> list[Row]:
    ratios = result["ratio_to_base"]
    return [(f"lora: {result['adapters']} adapters mixed / base model, output tok/s",
             f"{ratios['lora-mix']:.2f}x (LoRA on and unused: {ratios['lora-idle']:.2f}x)",
             _verdict(ratios["lora-mix"], LORA_TARGET, "x"))]


def _profile(result: dict[str, Any]) -> list[Row]:
    rows = []
    for run in result["runs"]:
        mean = run["mean"]
        busy = mean["gpu_busy_fraction"]
        top = run["top_host_costs"][0] if run["top_host_costs"] else None
        kernel = (run.get("top_device_kernels") or [None])[0]  # none in runs from before
        python = _top_engine_function(run.get("top_python") or [])
        what = (f"prefill step of {run['prefill_tokens']} tokens" if "prefill_tokens" in run
                else f"batch {run['batch_size']}: decode step")
        rows.append((f"profile, {run['part']}, {what}",
                     f"{run['step_us']['median'] / 1e3:.2f} ms; {mean['kernel_launches']:.0f} "
                     f"kernel + {mean['graph_launches']:.0f} graph launches, "
                     f"{mean['device_kernels']:.0f} kernels, GPU busy "
                     + ("-" if busy is None else f"{busy:.0%}")
                     + ("" if top is None else f"; top host cost {top['name']} "
                        f"{top['self_us_per_step'] / 1e3:.2f} ms")
                     + ("" if kernel is None else f"; top kernel {kernel['name'][:60]} "
                        f"{kernel['device_us_per_step'] / 1e3:.2f} ms")
                     + ("" if python is None else f"; top engine function {python['function']} "
                        f"{python['self_us_per_step'] / 1e3:.2f} ms self"), ""))
    return rows


def _top_engine_function(functions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first of a run's cProfiled functions that is the engine's own code."""
    return next((f for f in functions if f["function"].startswith("engine/")), None)


def _startup(result: dict[str, Any]) -> list[Row]:
    rows = []
    for run in result["runs"]:
        phases = run["phases"]
        sizing = (f"utilization {run['gpu_memory_utilization']:g}"
                  if run["gpu_memory_utilization"] is not None
                  else f"KV {run['kv_cache_memory'] / 2**20:.0f} MiB")
        memory = run["device_memory"]
        used = "" if memory is None else (
            f"; device {memory['used_fraction']:.1%} in use of "
            f"{memory['asked_utilization']:.0%} asked")
        rows.append((f"startup, {run['part']} ({sizing})",
                     f"{phases['total_seconds']:.1f} s: weights {phases['weights_seconds']:.1f}"
                     f" s ({run['load']['load_gb_per_s']:.2f} GB/s), KV profile "
                     f"{phases['kv_profile_seconds']:.1f} s, graphs "
                     f"{phases['graph_capture_seconds']:.1f} s; KV pool "
                     f"{run['memory']['kv_pool_bytes'] / 2**30:.2f} GiB{used}", ""))
    return rows


def _kernels(result: dict[str, Any]) -> list[Row]:
    parts = result["parts"]
    rows = []
    for run in parts.get("weight-only", {}).get("runs", []):
        best, base = run["best"], run["baselines"]
        if best is None:
            continue
        scaled = base.get("scaled_mm_us")
        rows.append((f"kernels, fp8 weight-only {run['shape']} ({run['outputs']}x{run['inner']}),"
                     f" {run['rows']} row{'s' if run['rows'] > 1 else ''}: us",
                     f"best {best['us']:.1f} ({best['of_bandwidth']:.0%} of bandwidth), default "
                     f"{run['default_us']:.1f}; bf16 linear {base['dense_linear_us']:.1f}"
                     + ("" if scaled is None else f", fp8 _scaled_mm {scaled:.1f}"), ""))
    for part, against in (("prefill-attention", "sdpa_us"), ("decode-attention", "bound_us")):
        sweep = parts.get(part)
        if not sweep or sweep["best"] is None:
            continue
        best, default = sweep["best"]["us"], sweep["default_us"]
        times = "; ".join(f"{name} {best[name]:.0f} (default {default[name]:.0f})"
                          for name in best)
        ref = sweep[against]
        ref_text = (f"SDPA over the prompt {ref:.0f}" if part == "prefill-attention" else
                    "bound " + ", ".join(f"{name} {us:.0f}" for name, us in ref.items()))
        rows.append((f"kernels, {part}: best us", f"{times}; {ref_text}", ""))
    return rows


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "tests": _tests,
    "bench-throughput": _part("throughput", {"cuda-graphs": (THROUGHPUT_TARGET, ""),
                                             "graphs-async": (THROUGHPUT_TARGET, "")}),
    "bench-hf": _part("hf"),
    "bench-batch1": _part("batch1", {"cuda-graphs": (BATCH1_TARGET, ""),
                                     "graphs-async": (BATCH1_TARGET, "")}),
    "bench-throughput-fp8": _part("throughput-fp8"),
    "bench-batch1-fp8": _part("batch1-fp8"),
    "bench-batch1-ngram": _part("batch1-ngram"),
    "bench-throughput-budget": _part("throughput-budget"),
    "bench-kv-offload": _kv_offload,
    "bench-lora": _lora,
    "profile": _profile,
    "startup": _startup,
    "kernels": _kernels,
}
