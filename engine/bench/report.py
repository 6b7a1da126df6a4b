"""What a benchmark reports: the summary numbers, the human table, and the auditable JSON.

The JSON carries everything needed to check a figure later: the command line, the machine,
the git revision (and whether the tree was dirty), per-request timings and the summary.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # both import torch: only when a benchmark runs
    from tokenmill.engine.bench.engine_run import EngineRun
    from tokenmill.engine.bench.hf_baseline import HFRun

REPO_ROOT = Path(__file__).resolve().parents[2]
STEADY_FRACTION = 0.5


def machine_info(device: str) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "load_average_after": list(os.getloadavg()),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def distribution(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99))}


def kv_summary(run: EngineRun) -> dict[str, Any]:
    """Mean waste over every step holding blocks, and at steady state: the steps whose batch is
    at least half the peak batch (ramp-up and the draining tail excluded). Waste counts the
    steps where it was sampled (engine_run.STATS_SHARE); usage, every step."""
    live = [s for s in run.steps if s.used_blocks > 0]
    if not live:
        return {"waste_mean": None, "waste_steady": None, "peak_usage": 0.0, "steady_steps": 0,
                "waste_steps": 0}
    peak = max(s.num_running for s in live)
    steady = [s for s in live if s.num_running >= STEADY_FRACTION * peak]
    return {
        "waste_mean": _mean_waste(live),
        "waste_steady": _mean_waste(steady),
        "usage_steady": float(np.mean([s.usage for s in steady])),
        "peak_usage": max(s.usage for s in live),
        "peak_running": peak,
        "steady_steps": len(steady),
        "waste_steps": sum(1 for s in live if s.waste is not None),
    }


def _mean_waste(steps: list[Any]) -> float | None:
    sampled = [s.waste for s in steps if s.waste is not None]
    return float(np.mean(sampled)) if sampled else None


def summarize(run: EngineRun, hf_runs: list[HFRun]) -> dict[str, Any]:
    out_tokens = sum(r["output_len"] for r in run.requests)
    in_tokens = sum(r["input_len"] for r in run.requests)
    tokenmill = {
        "elapsed_s": run.elapsed_s,
        "output_tokens": out_tokens,
        "input_tokens": in_tokens,
        "output_tokens_per_s": out_tokens / run.elapsed_s,
        "total_tokens_per_s": (out_tokens + in_tokens) / run.elapsed_s,
        "requests_per_s": len(run.requests) / run.elapsed_s,
        "ttft_s": distribution([r["ttft_s"] for r in run.requests]),
        "e2e_s": distribution([r["e2e_s"] for r in run.requests]),
        "num_steps": len(run.steps),
        "step_s": distribution([s.step_s for s in run.steps]),
        "num_preemptions": run.num_preemptions,
        "kv_cache": kv_summary(run),
        "stats_overhead_s": run.stats_overhead_s,
    }
    hf = {str(h.batch_size): {"elapsed_s": h.elapsed_s, "output_tokens": h.output_tokens,
                              "output_tokens_per_s": h.output_tokens_per_s,
                              "batch_times_s": h.batch_times_s} for h in hf_runs}
    summary: dict[str, Any] = {"tokenmill": tokenmill, "hf": hf, "hf_best_batch_size": None,
                               "ratio": None}
    if hf_runs:
        best = max(hf_runs, key=lambda h: h.output_tokens_per_s)
        summary["hf_best_batch_size"] = best.batch_size
        summary["ratio"] = tokenmill["output_tokens_per_s"] / best.output_tokens_per_s
    return summary


def format_table(summary: dict[str, Any]) -> str:
    tm = summary["tokenmill"]
    kv = tm["kv_cache"]
    rows = [("tokenmill output tok/s", f"{tm['output_tokens_per_s']:.1f}"),
            ("tokenmill wall time", f"{tm['elapsed_s']:.1f} s")]
    for size, h in summary["hf"].items():
        rows.append((f"HF generate batch {size} tok/s",
                     f"{h['output_tokens_per_s']:.1f} ({h['elapsed_s']:.1f} s)"))
    if summary["ratio"] is not None:
        rows.append((f"ratio vs HF best (batch {summary['hf_best_batch_size']})",
                     f"{summary['ratio']:.2f}x"))
    for name in ("ttft_s", "e2e_s"):
        d = tm[name]
        rows.append((f"{name[:-2].upper()} mean / P50 / P99",
                     f"{d['mean']:.2f} / {d['p50']:.2f} / {d['p99']:.2f} s"))
    if kv["waste_mean"] is not None:
        steady = "n/a" if kv["waste_steady"] is None else f"{kv['waste_steady']:.1%}"
        rows.append(("KV waste mean / steady", f"{kv['waste_mean']:.1%} / {steady}"))
        rows.append(("KV usage peak", f"{kv['peak_usage']:.1%}"))
    rows.append(("preemptions", str(tm["num_preemptions"])))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def write_json(path: str, payload: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")


def command_line() -> str:
    return " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])
