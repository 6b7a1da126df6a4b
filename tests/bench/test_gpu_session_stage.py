"""`tokenmill bench gpu session`, dry: its steps run as commands of their own in the order
given, within the budget; a step not worth starting is skipped, one still running at the
budget's end is stopped, and what each did is written down."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from gpu_machine_support import gpu_machine_env

from tokenmill.engine.bench.gpu_suite.context import SuiteContext
from tokenmill.engine.bench.gpu_suite.session_stage import _step


def session(out, *flags: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "tokenmill.engine.cli", "bench", "gpu", "session",
         "--dry-run", "--out", str(out), "--model-dir", str(out / "model"), "--no-progress",
         *flags],
        env=gpu_machine_env(out / "python-without"), cwd=out, capture_output=True, text=True,
        timeout=300)
    return done.returncode, json.loads((out / "gpu-dry-run-session.json").read_text())


def test_steps_run_in_order_within_the_budget(tmp_path):
    code, written = session(tmp_path, "--only", "summary,batch1-fp8", "--budget", "250")
    assert code == 0
    steps = written["result"]["steps"]
    assert [(s["step"], s["outcome"]) for s in steps] == [("batch1-fp8", "passed"),
                                                         ("summary", "passed")]
    part = json.loads((tmp_path / "gpu-dry-run-bench-batch1-fp8.json").read_text())
    assert set(part["result"]["modes"]) == {"bf16", "fp8", "kv-fp8"}


def test_a_step_without_enough_time_is_skipped(tmp_path):
    code, written = session(tmp_path, "--only", "tests,summary", "--budget", "30")
    assert code == 0
    assert [(s["step"], s["outcome"]) for s in written["result"]["steps"]] == [
        ("tests", "skipped"), ("summary", "passed")]


def test_a_step_running_at_the_budgets_end_is_stopped(tmp_path):
    ctx = SuiteContext(stage="session", out_dir=tmp_path, prefix="gpu-dry-run", dry_run=True,
                       model_dir=tmp_path / "model", show_progress=False)
    start = time.monotonic()
    outcome = _step(ctx, argparse.Namespace(progress=False), ["bench", "--only", "batch1"], 1.0)
    assert outcome["outcome"] == "stopped at the budget"
    assert time.monotonic() - start < 30
