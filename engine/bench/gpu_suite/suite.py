"""GPU acceptance: one command per stage, each inside ten minutes on one H100.

  tests    every CUDA-only test, and greedy equality with HF on CUDA (pytest; JSON of outcomes)
  bench    Llama-3.1-8B shapes: 256 requests, 64 requests against HF generate, batch-1 decode;
           eager against CUDA graphs, bf16 against fp8 weights and an fp8 KV cache; each decode
           step against its bandwidth bound; the KV host tier's copies against PCIe
  profile  torch.profiler over batch-1 and batch-256 decode steps: kernel launches per step,
           GPU-busy fraction, top host costs
  startup  loading the 8B checkpoint, profiling the KV pool, capturing graphs; memory left
  kernels  the Triton kernels' launch settings swept at the 8B shapes; the fastest correct ones
           written as a launch-config file for this GPU (TOKENMILL_KERNEL_CONFIGS)
  summary  the table for docs/benchmarks.md, from the JSON the stages wrote
  session  a session's first device call: the stages that matter most, in order, each a
           command of its own, inside --budget seconds

Each stage writes <prefix>-<stage or part>.json under --out as each part ends, so a stage cut
short keeps what it finished. --dry-run runs every stage on a tiny random Llama on the CPU with
cut-down workloads: the same code and the same JSON shape, to check the suite with no GPU.
It needs only torch, triton, transformers, safetensors, tokenizers and pytest.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from tokenmill.engine.bench.gpu_suite.context import (
    DEFAULT_MODEL_DIR,
    SuiteContext,
    default_prefix,
)

# Stage name -> module in this package with run(ctx, args).
STAGES = {"tests": "tests_stage", "bench": "bench_stage", "profile": "profile_stage",
          "startup": "startup_stage", "kernels": "kernels_stage", "summary": "summary",
          "session": "session_stage"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("stage", choices=list(STAGES), help="Which stage to run.")
    parser.add_argument("--out", default="docs/bench",
                        help="Directory of the raw JSON (default docs/bench).")
    parser.add_argument("--prefix", default=None,
                        help="File name prefix (default gpu-<GPU model>, e.g. gpu-h100; "
                             "gpu-dry-run for a dry run).")
    parser.add_argument("--dry-run", action="store_true",
                        help="A tiny random Llama on the CPU, workloads cut down.")
    parser.add_argument("--model-dir", default=None,
                        help="Where the random-weight checkpoint is kept, made there if missing "
                             f"(default {DEFAULT_MODEL_DIR}, -dry-run for a dry run).")
    parser.add_argument("--only", default=None,
                        help="Comma-separated parts of the stage to run (default: all; "
                             "`--only help` lists them).")
    parser.add_argument("--modes", default=None,
                        help="bench stage: comma-separated engine modes to run in each part "
                             "(default: all of the part's; the first one run is the ratios' "
                             "reference).")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="session stage: seconds for all its steps (default 540, inside "
                             "the device tool's ten minutes a command).")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="Show progress bars.")


def run(args: argparse.Namespace) -> int:
    model_dir = args.model_dir or (DEFAULT_MODEL_DIR + ("-dry-run" if args.dry_run else ""))
    ctx = SuiteContext(stage=args.stage, out_dir=Path(args.out),
                       prefix=args.prefix or default_prefix(args.dry_run),
                       dry_run=args.dry_run, model_dir=Path(model_dir),
                       show_progress=args.progress)
    if not args.dry_run and args.stage not in ("summary",):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("tokenmill bench gpu: no CUDA device here; --dry-run runs the "
                             "suite on the CPU")
    module = importlib.import_module(f"tokenmill.engine.bench.gpu_suite.{STAGES[args.stage]}")
    return module.run(ctx, args)


def selected(parts: list[str], only: str | None) -> list[str]:
    """The parts `--only` names, in the stage's order; SystemExit naming unknown ones."""
    if only is None:
        return parts
    if only == "help":
        raise SystemExit("parts: " + ", ".join(parts))
    wanted = [p.strip() for p in only.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in parts]
    if unknown:
        raise SystemExit(f"--only: unknown parts {unknown}; this stage has {parts}")
    return [p for p in parts if p in wanted]
