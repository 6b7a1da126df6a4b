"""Offline throughput: tokenmill against HF transformers generate on the same seeded workload."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tokenmill.engine.bench.workload import BenchRequest, make_workload, parse_range

if TYPE_CHECKING:
    from tokenmill.engine.bench.bandwidth import Bandwidth


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Workload and report flags; the engine flags come from EngineConfig (cli.py)."""
    parser.add_argument("--num-prompts", type=int, default=64, help="Requests in the workload.")
    parser.add_argument("--input-len", type=parse_range, default="32:512",
                        help="Prompt length range LOW:HIGH, uniform, inclusive (default 32:512).")
    parser.add_argument("--output-len", type=parse_range, default="16:256",
                        help="Output length range LOW:HIGH, uniform, inclusive (default 16:256).")
    parser.add_argument("--workload-seed", type=int, default=0,
                        help="Seed of the workload generator (--seed seeds the engine).")
    parser.add_argument("--hf-batch-sizes", type=parse_batch_sizes, default="8,32",
                        help="Static batch sizes for the HF generate baseline, comma separated; "
                             "empty or 'none' skips the baseline (default 8,32).")
    parser.add_argument("--prefix-cache-ab", action="store_true",
                        help="Also run the workload on two engines, prefix cache off and on, "
                             "stepped side by side, and report the throughput ratio.")
    parser.add_argument("--compare-quantization", metavar="MODES", type=_modes, default=None,
                        help="Also run the workload unquantized and in each of these modes "
                             "(comma separated, e.g. int8,kv-int8; 'all' for every mode) at the "
                             "same KV budget, and report throughput and KV capacity ratios.")
    parser.add_argument("--compare-tensor-parallel", metavar="SIZES", type=_tp_sizes,
                        default=None,
                        help="Also run the workload at each of these tensor-parallel sizes "
                             "(comma separated, the first is the reference, e.g. 1,2) and "
                             "report throughput ratios and the collectives' time per step.")
    parser.add_argument("--compare-cuda-graphs", action="store_true",
                        help="Also run the workload with --enforce-eager and with decode CUDA "
                             "graphs (on CUDA with the Triton kernels), and report the "
                             "throughput ratio and decode step times.")
    parser.add_argument("--compare-async-scheduling", action="store_true",
                        help="Also run the workload without and with --async-scheduling, and "
                             "report the throughput ratio and decode step times.")
    parser.add_argument("--compare-preemption", action="store_true",
                        help="Also run the workload with preempted sequences resumed three "
                             "ways at the same device pool (--kv-cache-memory, small enough to "
                             "preempt): recomputed (no prefix cache), from the prefix cache, and "
                             "from the prefix cache with its host tier (--kv-offloading-size; "
                             "default 4 device pools); report throughput and where the "
                             "preempted work came back from.")
    parser.add_argument("--compare-lora", metavar="N", type=_positive, default=None,
                        help="Also run the workload on the base model alone, with LoRA enabled "
                             "and unused, and spread round robin over N random adapters of "
                             "rank 16 on every projection (--max-loras N), side by side, and "
                             "report the throughput ratios to the base.")
    parser.add_argument("--structured-fraction", metavar="F", type=_fraction, default=None,
                        help="Also run the workload with a JSON schema on this fraction of its "
                             "requests (e.g. 0.5: every other one) side by side with the free "
                             "workload, and report the throughput ratio (structured outputs' "
                             "cost).")
    parser.add_argument("--bandwidth", metavar="GBPS", type=_bandwidth, default=None,
                        help="Device memory bandwidth in GB/s (1e9 bytes/s, a copy's bytes read "
                             "plus written) for the decode-step bound; measured on the engine's "
                             "device when not given.")
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")
    parser.add_argument("--plot", metavar="PATH", help="Write a PNG plot (needs matplotlib).")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="Show progress bars.")


def _modes(text: str) -> list[str]:
    from tokenmill.engine.bench.quant_modes import MODES, parse_modes

    try:
        return list(MODES) if text.strip() == "all" else parse_modes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tp_sizes(text: str) -> list[int]:
    from tokenmill.engine.bench.tp_ab import parse_sizes

    return parse_sizes(text)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.5, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"the fraction must be in (0, 1], got {text!r}")
    return value


def _bandwidth(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GB/s like 3000, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"bandwidth must be positive, got {text!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Comparison:
    """An optional comparison on the benchmark's workload: the summary key of its result, its
    module (imported only when asked for: it has compare(config, workload, ..., show_progress)
    and format_comparison(result)), what to say as it starts, and the name of compare's
    parameter that takes the flag's value (none for a plain switch)."""

    summary_key: str
    module: str
    status: Callable[[Any], str]
    keyword: str | None = None

    def load(self) -> ModuleType:
        return importlib.import_module(f"tokenmill.engine.bench.{self.module}")


# The comparisons by the argparse dest of the flag that asks for one, in the order they run and
# print: a new comparison is its flag in add_arguments and one entry here.
COMPARISONS: dict[str, Comparison] = {
    "prefix_cache_ab": Comparison("prefix_cache_ab", "prefix_ab",
                                  lambda _: "prefix cache off and on, side by side"),
    "compare_quantization": Comparison(
        "quantization", "quant_ab",
        lambda modes: f"quantization modes at the same KV budget: {modes}", "modes"),
    "compare_tensor_parallel": Comparison(
        "tensor_parallel", "tp_ab", lambda sizes: f"tensor-parallel sizes: {sizes}", "sizes"),
    "compare_cuda_graphs": Comparison(
        "cuda_graphs", "graphs_ab", lambda _: "decode CUDA graphs off (--enforce-eager) and on"),
    "compare_async_scheduling": Comparison(
        "async_scheduling", "async_ab", lambda _: "async scheduling off and on"),
    "compare_preemption": Comparison(
        "preemption", "preempt_ab",
        lambda _: "preemptions resumed by recompute, the prefix cache, and its host tier"),
    "compare_lora": Comparison(
        "lora", "lora_ab", lambda n: f"the base model alone, LoRA idle, and {n} adapters mixed",
        "adapters"),
    "structured_fraction": Comparison(
        "structured_outputs", "structured_ab",
        lambda fraction: f"a JSON schema on {fraction:g} of the requests, side by side with "
                         "the free workload", "fraction"),
}


def parse_batch_sizes(text: str) -> list[int]:
    """'8,32' -> [8, 32]; '' or 'none' -> [] (no baseline)."""
    if text.strip().lower() in ("", "none"):
        return []
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 8,32, got {text!r}") from None
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    """Build the workload, run tokenmill then HF on it, print the table, write JSON and plot."""
    summary, payload = benchmark(args)
    from tokenmill.engine.bench.decode_bound import format_summary as format_decode_bound
    from tokenmill.engine.bench.report import format_table, write_json

    print(format_table(summary))
    print(format_decode_bound(summary["decode_bound"]))
    for comparison in COMPARISONS.values():
        if comparison.summary_key in summary:
            print(comparison.load().format_comparison(summary[comparison.summary_key]))
    if args.json:
        write_json(args.json, payload)
        print(f"raw results: {args.json}")
    if args.plot:
        from tokenmill.engine.bench.plot import write_plot

        title = f"{args.model}, {args.num_prompts} requests"
        if write_plot(args.plot, summary, title):
            print(f"plot: {args.plot}")
        else:
            print("plot skipped: matplotlib is not installed", file=sys.stderr)
    return 0


def benchmark(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole measurement; returns (summary, JSON payload)."""
    from tokenmill.engine import LLM
    from tokenmill.engine.bench import decode_bound, engine_run, hf_baseline, report
    from tokenmill.engine.contract.config import engine_config_from_args

    config = engine_config_from_args(args)
    load_before = list(os.getloadavg())
    revision = report.git_revision()  # before the run: the code that is measured
    llm = LLM(**dataclasses.asdict(config), show_progress=args.progress)
    engine = llm.engine
    workload = make_workload(args.num_prompts, args.input_len, args.output_len,
                             args.workload_seed, engine.model_config.vocab_size,
                             special_ids(llm.tokenizer))
    plain_token = workload[0].prompt_token_ids[0]
    _status(f"workload: {len(workload)} requests, {_lengths(workload)}")
    engine_run.warm_up(llm, workload[0].prompt_token_ids)
    ours = engine_run.run_engine(llm, workload, args.progress)
    device, dtype = engine.device, engine.dtype
    memory = engine.memory_report()
    llm.shutdown()  # ends tensor-parallel workers: the comparisons start their own
    del llm, engine
    bandwidth = _bandwidth_for(args.bandwidth, device)

    hf_runs = []
    if args.hf_batch_sizes:
        _status("loading the model in HF transformers")
        model = hf_baseline.load_hf_model(config.model, dtype).to(device)
        hf_baseline.warm_up(model, plain_token)
        hf_runs = [hf_baseline.run_hf(model, workload, size, args.progress)
                   for size in args.hf_batch_sizes]
        del model

    summary = report.summarize(ours, hf_runs)
    summary["decode_bound"] = decode_bound.summarize(
        engine_run.decode_steps(ours), memory["step_weights_bytes"],
        memory["kv_bytes_per_token"] or 0, bandwidth)
    for dest, comparison in COMPARISONS.items():
        value = getattr(args, dest)
        if value:
            _status(comparison.status(value))
            option = {comparison.keyword: value} if comparison.keyword else {}
            summary[comparison.summary_key] = comparison.load().compare(
                config, workload, show_progress=args.progress, **option)
    payload = {
        "benchmark": "offline",
        "command": report.command_line(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "engine_config": dataclasses.asdict(config),
        "machine": {**report.machine_info(str(device)), "load_average_before": load_before},
        "git": revision,
        "summary": summary,
        "requests": ours.requests,
        "kv_steps": [dataclasses.asdict(s) for s in ours.steps],
    }
    return summary, payload


def _bandwidth_for(given: float | None, device: Any) -> Bandwidth:
    """The figure given, else one measured on the engine's device once the engine is gone (its
    KV pool no longer holds the memory the copy needs)."""
    from tokenmill.engine.bench.bandwidth import given_bandwidth, measure_bandwidth

    if given is not None:
        return given_bandwidth(given)
    gc.collect()
    _status(f"measuring memory bandwidth on {device}")
    return measure_bandwidth(device)


def special_ids(tokenizer: Any) -> set[int]:
    """Every id the tokenizer treats as special, including added control tokens."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
    return ids


def _lengths(workload: list[BenchRequest]) -> str:
    ins = [r.input_len for r in workload]
    outs = [r.output_len for r in workload]
    return (f"input {min(ins)}..{max(ins)} (sum {sum(ins)}), "
            f"output {min(outs)}..{max(outs)} (sum {sum(outs)})")


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
