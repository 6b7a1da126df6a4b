"""Autoscaling benchmark: the operator against the emulated cluster with real engines, under a
load that steps up and down; writes a JSON report and a PNG of queue depth, replicas and P99
TTFT over time.

    python tests/operator/bench_autoscale.py --json docs/bench/autoscale-cpu-smollm2.json \\
        --plot docs/bench/autoscale-cpu-smollm2.png

(run it from any directory but the repository root, or as above: the script's own directory
goes on sys.path, not the root, whose operator/ would shadow Python's operator module).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, only this file's directory is on sys.path: the modules every group of tests
# shares are one level up (under pytest, tests/conftest.py puts that directory on sys.path).
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from autoscale_harness import Kubelet, Load, queue  # noqa: E402
from model_support import smollm2_checkpoint  # noqa: E402
from operator_support import IS_PATH, REPO, inference_service, running_operator  # noqa: E402

NAME = "chat"
SAMPLE_SECONDS = 0.5
TTFT_WINDOW_SECONDS = 10.0
# (seconds, open streams): idle, a load one replica holds at the target, a queue that needs
# three, then nothing.
PHASES = [(15, 0), (30, 4), (100, 12), (50, 0)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None, help="Write the report here.")
    p.add_argument("--plot", default=None, help="Write the PNG here (needs matplotlib).")
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="Only redraw --plot from a report this script wrote earlier.")
    p.add_argument("--interval", type=float, default=5.0, help="Autoscaler interval (s).")
    p.add_argument("--scale-down-delay", type=int, default=20)
    p.add_argument("--target-queue-depth", type=int, default=2)
    p.add_argument("--max-replicas", type=int, default=3)
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=24)
    return p.parse_args(argv)


async def scenario(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model_dir = smollm2_checkpoint(work / "smollm2")
    env = {"TOKENMILL_AUTOSCALE_INTERVAL": str(args.interval)}
    async with running_operator(work, env=env) as k:
        await k.request("POST", IS_PATH.format(ns="default"), inference_service(NAME, {
            "model": {"uri": str(model_dir)},
            "resources": {"gpus": 0},
            "engine": {"maxNumSeqs": args.max_num_seqs},
            "shutdownTimeoutSeconds": 5,
            "autoscaling": {"minReplicas": 1, "maxReplicas": args.max_replicas,
                            "targetQueueDepth": args.target_queue_depth,
                            "scaleDownDelaySeconds": args.scale_down_delay},
        }))
        kubelet = Kubelet(k, "default", NAME, work)
        task = asyncio.create_task(kubelet.run())
        try:
            while len(kubelet.ready) < 1:
                if task.done():
                    task.result()
                await asyncio.sleep(0.2)
            await asyncio.sleep(2 * args.interval)  # the autoscaler has seen the idle replica
            t0 = time.monotonic()
            load = Load(kubelet, model=NAME, max_tokens=args.max_tokens)
            samples, phases = [], []
            for seconds, streams in PHASES:
                await load.set_streams(streams)
                phases.append({"start_s": time.monotonic() - t0, "streams": streams})
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    if task.done():
                        task.result()
                    waiting, running = await queue(kubelet.ready)
                    samples.append({"t_s": round(time.monotonic() - t0, 2),
                                    "waiting": waiting, "running": running,
                                    "replicas": kubelet.counts()[-1],
                                    "ready": len(kubelet.ready), "streams": streams})
                    await asyncio.sleep(SAMPLE_SECONDS)
            await load.set_streams(0)
            isvc = await k.get(f"{IS_PATH.format(ns='default')}/{NAME}")
            events = [{"reason": e["reason"], "message": e["message"]}
                      for e in await k.events() if e["reason"] in ("ScaledUp", "ScaledDown")]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    changes = [{"t_s": round(t - t0, 2), "replicas": n} for t, n in kubelet.history
               if t >= t0]
    requests = [{"start_s": round(s.result.start_s, 3), "end_s": round(s.end_s, 3),
                 "ttft_s": s.result.ttft_s, "e2e_s": s.result.e2e_s, "pod": s.pod,
                 "error": s.result.error} for s in load.results]
    return {"samples": samples, "phases": phases, "replica_changes": changes,
            "requests": requests, "events": events,
            "status_autoscaler": (isvc.get("status") or {}).get("autoscaler")}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def ttft_windows(requests: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(window end, P99 TTFT) of the requests that started in each window."""
    by_window: dict[int, list[float]] = {}
    for r in requests:
        if r["ttft_s"] is not None:
            by_window.setdefault(int(r["start_s"] // TTFT_WINDOW_SECONDS), []).append(r["ttft_s"])
    return [((w + 1) * TTFT_WINDOW_SECONDS, p99(v)) for w, v in sorted(by_window.items())]


def summarize(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    phases, changes, samples = run["phases"], run["replica_changes"], run["samples"]
    spike, stop = phases[2]["start_s"], phases[3]["start_s"]
    steady_start = phases[1]["start_s"]
    over = next(s for s in samples if s["t_s"] >= spike
                and s["waiting"] > args.target_queue_depth * s["replicas"])
    up = next(c for c in changes if c["t_s"] >= spike)
    top = max(c["replicas"] for c in changes)
    reached = next(s["t_s"] for s in samples if s["t_s"] >= spike and s["ready"] == top)
    downs = [c for c in changes if c["t_s"] >= stop]
    ok = [r for r in run["requests"] if r["error"] is None]
    return {
        "replica_sequence": [1] + [c["replicas"] for c in changes],
        "interval_s": args.interval,
        "queue_over_target_at_s": over["t_s"],
        "scale_up_at_s": up["t_s"],
        "scale_up_latency_s": round(up["t_s"] - over["t_s"], 2),
        "scale_up_to": up["replicas"],
        "all_replicas_ready_at_s": reached,
        "changes_while_steady_at_4_streams": sum(steady_start <= c["t_s"] < spike
                                                 for c in changes),
        "changes_while_steady_at_12_streams": sum(up["t_s"] < c["t_s"] < stop for c in changes),
        "scale_downs_after_load_stop": len(downs),
        "scale_down_after_s": round(downs[0]["t_s"] - stop, 2) if downs else None,
        "scale_down_delay_s": args.scale_down_delay,
        "requests_ok": len(ok),
        "requests_failed": len(run["requests"]) - len(ok),
        "ttft_p99_s_by_window": [(round(t, 1), round(v, 3)) for t, v in
                                 ttft_windows(run["requests"])],
    }


def plot(path: str, run: dict[str, Any], target_queue_depth: int) -> None:
    """Three panels over time: queue depth against its target, replicas, windowed P99 TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = run["samples"]
    t = [s["t_s"] for s in samples]
    end = samples[-1]["t_s"]
    changes = [(0.0, 1)] + [(c["t_s"], c["replicas"]) for c in run["replica_changes"]]
    changes.append((end, changes[-1][1]))
    fig, (queue_ax, replica_ax, ttft_ax) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    queue_ax.plot(t, [s["waiting"] for s in samples], label="waiting", color="tab:blue")
    queue_ax.step(t, [target_queue_depth * s["replicas"] for s in samples], where="post",
                  label="target x replicas", color="tab:gray")
    queue_ax.set_ylabel("requests waiting")
    replica_ax.step([c[0] for c in changes], [c[1] for c in changes], where="post",
                    label="deployment", color="tab:orange")
    replica_ax.step(t, [s["ready"] for s in samples], where="post", label="ready",
                    color="tab:green")
    replica_ax.step(t, [s["streams"] / 4 for s in samples], where="post", label="streams / 4",
                    color="tab:gray", linestyle="--")
    replica_ax.set_ylabel("replicas")
    windows = ttft_windows(run["requests"])
    ttft_ax.plot([w for w, _ in windows], [v for _, v in windows], marker="o", color="tab:red",
                 label=f"P99 TTFT, {TTFT_WINDOW_SECONDS:.0f} s windows")
    ttft_ax.set_ylabel("seconds")
    ttft_ax.set_xlabel("time (s)")
    for ax in (queue_ax, replica_ax, ttft_ax):
        ax.legend(loc="upper right", fontsize="small")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) // 1024 ** 2 for line in
                Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), None)
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem,
            "python": platform.python_version()}


def revision() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout
    return {"revision": git("rev-parse", "--short", "HEAD").strip(),
            "dirty": bool(git("status", "--porcelain").strip())}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        report = json.loads(Path(args.replot).read_text())
        plot(args.plot, report, report["settings"]["target_queue_depth"])
        return 0
    with tempfile.TemporaryDirectory(prefix="tokenmill-autoscale-") as work:
        started = time.strftime("%Y-%m-%d")
        run = asyncio.run(scenario(args, Path(work)))
    summary = summarize(run, args)
    report = {"command": " ".join(["python", "tests/operator/bench_autoscale.py", *sys.argv[1:]]),
              "date": started, "machine": machine(), "git": revision(),
              "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
              "phases_s_streams": PHASES, **run, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(args.plot, run, args.target_queue_depth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
