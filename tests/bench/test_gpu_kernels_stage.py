"""`tokenmill bench gpu kernels`: launch settings swept per kernel, each candidate checked, then
timed; the fastest written as a launch-config file the kernels read. A dry run on the CPU
(Triton's interpreter, tiny shapes, two or three candidates), in a Python that lacks what the
GPU machine lacks."""

from __future__ import annotations

import json

import pytest
import torch

from tokenmill.engine.bench.gpu_suite import kernels_stage, summary
from tokenmill.engine.kernels.launch_configs import (
    ENV_VAR,
    KERNEL_DEFAULTS,
    clear_cache,
    launch_config,
    weight_key,
)

# The kernels' modules are not imported here: a Triton kernel is compiled or interpreted as
# TRITON_INTERPRET says when its module is first imported, which tests/device_kernels sets.


@pytest.fixture(scope="module")
def kernels(gpu_dry_run):
    return gpu_dry_run("kernels")


def test_every_weight_shape_is_swept_at_one_row_and_at_several(kernels):
    result = kernels["result"]
    runs = result["parts"]["weight-only"]["runs"]
    assert [(r["shape"], r["rows"]) for r in runs] == [
        (name, rows) for name in kernels_stage.DRY_WEIGHT_SHAPES for rows in kernels_stage.DRY_ROWS]
    for run in runs:
        candidates = run["candidates"]
        # The defaults first; a row per program only where there is one row.
        assert candidates[0]["settings"] == KERNEL_DEFAULTS["weight_only_matmul"]
        assert all(not c["settings"]["rowwise"] for c in candidates) or run["rows"] == 1
        assert all("error" not in c and c["us"] > 0 for c in candidates), candidates
        assert run["best"] == min(candidates, key=lambda c: c["us"])
        assert run["default_us"] == candidates[0]["us"]
        base = run["baselines"]
        assert base["dense_linear_us"] > 0 and base["scaled_mm_us"] > 0
        assert run["weight_bytes"] == run["outputs"] * run["inner"] * 2  # float16 on the CPU


def test_attention_candidates_are_ranked_against_the_defaults_over_every_workload(kernels):
    parts = kernels["result"]["parts"]
    for part, defaults in (("prefill-attention", KERNEL_DEFAULTS["prefill_attention"]),
                           ("decode-attention", KERNEL_DEFAULTS["decode_attention"])):
        sweep = parts[part]
        candidates = sweep["candidates"]
        assert candidates[0]["settings"] == defaults and len(candidates) == 2
        assert candidates[0]["relative"] == pytest.approx(1.0)
        for entry in candidates:
            assert set(entry["us"]) == set(sweep["default_us"])
            assert entry["relative"] == pytest.approx(
                sum(entry["us"][n] / sweep["default_us"][n] for n in entry["us"]) / 2)
        assert sweep["best"] == min(candidates, key=lambda c: c["relative"])
    assert parts["prefill-attention"]["sdpa_us"] > 0
    assert parts["decode-attention"]["splits"] == {"batch4-ctx40": 1, "batch1-ctx64": 1}


def test_the_written_file_holds_each_best_under_the_key_its_kernel_looks_up(
        kernels, gpu_dry_run, monkeypatch):
    path = gpu_dry_run.directory("kernels") / "launch-configs-cpu.json"
    table = json.loads(path.read_text())
    assert table == kernels["result"]["launch_configs"]
    runs = kernels["result"]["parts"]["weight-only"]["runs"]
    monkeypatch.setenv(ENV_VAR, str(path))
    clear_cache()
    try:
        for run in runs:
            key = weight_key(run["rows"], run["outputs"], run["inner"])
            assert launch_config("weight_only_matmul", key,
                                 torch.device("cpu")) == run["best"]["settings"]
        parts = kernels["result"]["parts"]
        # The attention kernels' key: query dtype, cache dtype, head size, group (float32 here).
        heads, kv_heads, dim = kernels_stage.DRY_HEADS
        key = f"float32:float32:d{dim}:g{heads // kv_heads}"
        for part, kernel in (("prefill-attention", "prefill_attention"),
                             ("decode-attention", "decode_attention")):
            best = parts[part]["best"]["settings"]
            assert launch_config(kernel, key, torch.device("cpu")) == best
    finally:
        clear_cache()


def test_the_summary_reports_the_best_against_the_defaults_and_the_baselines(kernels):
    rows = summary._kernels(kernels["result"])
    assert len(rows) == len(kernels["result"]["parts"]["weight-only"]["runs"]) + 2
    assert rows[0][0] == "kernels, fp8 weight-only qkv (48x256), 1 row: us"
    assert "default" in rows[0][1] and "bf16 linear" in rows[0][1]
    assert rows[-2][0] == "kernels, prefill-attention: best us" and "SDPA" in rows[-2][1]
    assert rows[-1][0] == "kernels, decode-attention: best us" and "bound" in rows[-1][1]


def test_a_candidate_that_fails_or_differs_is_recorded_and_left_out():
    """A candidate that cannot launch (a compile error) or computes something else is an
    entry with its error, not a crash, and the fastest of the rest is chosen."""
    want = torch.arange(4.0)

    def check(out):
        torch.testing.assert_close(out, want)

    def cannot_compile(i):
        raise RuntimeError("arange's range must be a power of 2")

    ctx = type("Ctx", (), {"dry_run": True})()
    calls = {"broken": cannot_compile, "wrong": lambda i: want + 1, "right": lambda i: want}
    results = [kernels_stage._timed(ctx, torch.device("cpu"), {"name": name}, call, check,
                                    lambda s: {"rate": 1 / s})
               for name, call in calls.items()]
    assert results[0]["error"].startswith("RuntimeError: arange's range")
    assert results[1]["error"].startswith("AssertionError")
    assert "us" not in results[0] and "us" not in results[1]
    assert results[2]["us"] > 0 and results[2]["rate"] > 0
    assert kernels_stage._fastest(results) is results[2]


def test_a_spent_time_budget_leaves_out_the_candidates_after_the_defaults(kernels):
    seen = []
    tried = kernels_stage._sweep([{"a": 1}, {"a": 2}, {"a": 3}], deadline=0.0,
                                 measure=seen.append)
    assert (tried, seen) == (1, [{"a": 1}])
    tried = kernels_stage._sweep([{"a": 1}, {"a": 2}], deadline=float("inf"),
                                 measure=seen.append)
    assert tried == 2 and seen[1:] == [{"a": 1}, {"a": 2}]
    # A dry run has no budget: every candidate is tried.
    parts = kernels["result"]["parts"]
    weight = parts["weight-only"]
    assert weight["candidates_tried"] == weight["candidates"] == 3
    for part in ("prefill-attention", "decode-attention"):
        assert parts[part]["candidates_tried"] == parts[part]["candidates_listed"] == 2
