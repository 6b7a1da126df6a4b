"""The `session` stage: what a session lent a GPU runs first, in one device call. The steps
below, most telling first, each a `tokenmill bench gpu` command of its own (so one that
crashes or hangs costs only itself), each started only while the time left is worth it and
stopped when `--budget` seconds have passed since the stage began. What each step did goes to
<prefix>-session.json; the steps' own JSON goes where theirs always does.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status
from tokenmill.engine.bench.gpu_suite.suite import selected

# Step name -> the stage and its flags. Correctness first (what changed since the last run
# has never executed on a GPU), then the targets still missed.
STEPS: dict[str, list[str]] = {
    "tests": ["tests"],
    "throughput": ["bench", "--only", "throughput", "--modes", "cuda-graphs,graphs-async"],
    "batch1-fp8": ["bench", "--only", "batch1-fp8"],
    "profile": ["profile", "--only", "graphs"],
    "batch1": ["bench", "--only", "batch1"],
    "summary": ["summary"],
}
# A step is not started with less than this left (seconds): an engine start alone takes most
# of a minute on the 8B model; the summary only reads files.
LEAST_LEFT = {"summary": 5.0}
DEFAULT_LEAST_LEFT = 60.0


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.budget
    steps: list[dict[str, Any]] = []
    for name in selected(list(STEPS), args.only):
        left = deadline - time.monotonic()
        if left < LEAST_LEFT.get(name, DEFAULT_LEAST_LEFT):
            status(f"session: {name} skipped, {left:.0f} s left")
            steps.append({"step": name, "outcome": "skipped", "seconds": 0.0})
            continue
        status(f"session: {name} ({left:.0f} s left)")
        steps.append({"step": name, **_step(ctx, args, STEPS[name], left)})
    ctx.write("session", {"budget_s": args.budget, "steps": steps})
    return 0 if all(s["outcome"] in ("passed", "skipped") for s in steps) else 1


def _step(ctx: SuiteContext, args: argparse.Namespace, stage: list[str],
          left: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "tokenmill.engine.cli", "bench", "gpu", *stage,
               "--out", str(ctx.out_dir), "--prefix", ctx.prefix,
               "--model-dir", str(ctx.model_dir),
               *(["--dry-run"] if ctx.dry_run else []),
               *([] if args.progress else ["--no-progress"])]
    start = time.monotonic()
    # A session of its own, so that a step stopped at the budget takes its children along.
    step = subprocess.Popen(command, start_new_session=True)
    try:
        code = step.wait(timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(step.pid, signal.SIGKILL)
        step.wait()
        return {"outcome": "stopped at the budget", "seconds": time.monotonic() - start}
    return {"outcome": "passed" if code == 0 else f"exit {code}",
            "seconds": time.monotonic() - start}
