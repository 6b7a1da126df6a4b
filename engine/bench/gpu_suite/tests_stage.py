"""Stage `tests`: the tests that only a GPU runs in full, run where the GPU is.

  kernels   tests/device_kernels: the Triton kernels at real sizes, fp8 `kv_write` and
            `_scaled_mm`, decode graphs against eager steps, one sync per graphed step (they
            skip on the CPU), and the rest of the group on CUDA instead of the interpreter
  equality  greedy output equal to HF transformers in float32 for random Llama and Qwen3:
            decode graphs, ragged batches, chunked prefill, the prefix cache, TP=2 where two
            GPUs are visible

Each part is one pytest run from the repository's checkout (the tests are not packaged);
<prefix>-tests.json is rewritten as each ends, with every test's outcome. A dry run hides the
GPUs and takes a few tests of the same files: some that pass on the CPU and some that skip
there, so the selection and the report are checked without one.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status
from tokenmill.engine.bench.gpu_suite.pytest_report import passed, run_pytest
from tokenmill.engine.bench.gpu_suite.suite import selected

PARTS = ["kernels", "equality"]
KERNELS = "tests/device_kernels"
EQUALITY = f"{KERNELS}/test_cuda_equivalence.py"
# A dry run's kernel tests: CUDA-only ones (skipped on the CPU), two that run there, one of them
# on the tiny Llama (its fixture must work without the built-in model).
DRY_RUN_KERNELS = [
    f"{KERNELS}/test_decode_graphs.py::test_batch_sizes_are_vllm_buckets_up_to_max_num_seqs",
    f"{KERNELS}/test_decode_graphs.py::test_a_graphed_decode_step_waits_for_the_gpu_once",
    f"{KERNELS}/test_triton_kernels.py::test_real_sizes_on_gpu",
    f"{KERNELS}/test_kv_quant_kernels.py::test_fp8_kv_write_stores_the_reference_values_and_scales",
    f"{KERNELS}/test_kv_quant_kernels.py::test_int8_greedy_output_is_the_same_through_the_kernels",
    f"{KERNELS}/test_fp8_matmul.py::test_the_row_quantization_kernel_scales_divides_and_clamps_as_torch",
    f"{KERNELS}/test_fp8_matmul.py::test_fp8_linear_equals_the_dequantized_matmul_at_real_sizes",
]


# A dry run's equality test: one per model (the file runs whole in the CPU suite anyway).
DRY_RUN_EQUALITY = f"{EQUALITY}::test_ragged_batch_equals_hf_with_decode_graphs"


def selection(root: Path, parts: list[str], dry_run: bool) -> list[str]:
    """pytest's targets for these parts, relative to the repository root."""
    targets = []
    if "kernels" in parts:
        files = sorted(p.relative_to(root).as_posix() for p in (root / KERNELS).glob("test_*.py"))
        targets += DRY_RUN_KERNELS if dry_run else [f for f in files if f != EQUALITY]
    if "equality" in parts:
        targets.append(DRY_RUN_EQUALITY if dry_run else EQUALITY)
    return targets


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    from tokenmill.engine.bench.report import REPO_ROOT

    parts = selected(PARTS, args.only)
    if not (REPO_ROOT / KERNELS).is_dir():
        raise SystemExit(f"tokenmill bench gpu tests: no {KERNELS} under {REPO_ROOT}; run it "
                         "from the repository's checkout (pip install --no-deps -e .)")
    env = dict(os.environ)
    if ctx.dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, as every dry run
    result: dict[str, Any] = {"cuda": cuda_devices(ctx.dry_run), "parts": {}}
    for part in parts:
        status(f"tests: {part}")
        result["parts"][part] = run_pytest(REPO_ROOT, selection(REPO_ROOT, [part], ctx.dry_run),
                                           env)
        result.update(totals(result["parts"]))
        ctx.write("tests", result)
    return 0 if result["passed"] else 1


def totals(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counts and seconds summed over the parts run so far; passed when each part passed."""
    counts: dict[str, int] = {}
    for part in parts.values():
        for outcome, n in part["counts"].items():
            counts[outcome] = counts.get(outcome, 0) + n
    return {"counts": counts, "seconds": round(sum(p["seconds"] for p in parts.values()), 3),
            "passed": all(passed(p) for p in parts.values())}


def cuda_devices(dry_run: bool) -> dict[str, Any]:
    """The GPUs the tests see (none on a dry run, which hides them)."""
    import torch

    count = 0 if dry_run else torch.cuda.device_count()
    return {"device_count": count,
            "devices": [torch.cuda.get_device_name(i) for i in range(count)]}
