"""Host overhead per decode step: a tiny many-layer model, where a step is nearly all host work.

With hidden size 64 the arithmetic is negligible, so a decode step costs what the host does:
Python, op dispatch, building the step's inputs, scheduling and sampling. That is the work a
GPU step pays for before its kernels run, measured here on any machine. Reported per batch
size: wall time per step and per layer-step, the part outside the model forward (the time in
`engine.step` not spent in the decoder stack), and the aten ops dispatched per step and per
layer (the CPU proxy for kernel launches). The engine is timed by wrapping its methods in this
process, not by changing its code.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from tokenmill.engine.bench.offline import parse_batch_sizes

# Ops are counted on steps of their own: the counting mode slows every op down.
COUNTED_STEPS = 3
OUTPUT_KINDS = ("delta", "cumulative", "final-only")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Benchmark flags; the engine flags come from EngineConfig (cli.py)."""
    parser.set_defaults(model=None, kv_cache_memory=64 << 20)
    model = next(a for a in parser._actions if a.dest == "model")
    model.help = ("Model to measure (default: a random tiny model of --num-layers layers, "
                  "built in a temporary directory).")
    parser.add_argument("--num-layers", type=int, default=32,
                        help="Layers of the tiny random model built when --model is not given "
                             "(Llama, hidden 64, 4 heads, 2 KV heads, MLP 128; default 32).")
    parser.add_argument("--batch-sizes", type=_batch_sizes, default="1,16",
                        help="Decode batch sizes, comma separated (default 1,16).")
    parser.add_argument("--steps", type=int, default=100,
                        help="Timed decode steps per batch size (default 100).")
    parser.add_argument("--warmup-steps", type=int, default=10,
                        help="Untimed decode steps before them (default 10).")
    parser.add_argument("--prompt-len", type=int, default=16, help="Tokens of each prompt.")
    parser.add_argument("--output-kind", choices=OUTPUT_KINDS, default="delta",
                        help="What each step reports of every running request "
                             "(RequestOutputKind): its tokens added (delta, the default: what "
                             "the server asks for), its whole output so far (cumulative), or "
                             "nothing until it finishes (final-only, as LLM.generate).")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="Every request's temperature (default 0: greedy).")
    parser.add_argument("--top-p", type=float, default=1.0, help="Every request's top_p.")
    parser.add_argument("--top-k", type=int, default=-1, help="Every request's top_k.")
    parser.add_argument("--min-p", type=float, default=0.0, help="Every request's min_p.")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: tiny matrices gain nothing "
                             "from more, and idle threads spinning against other load make the "
                             "timings swing by orders of magnitude).")
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")


def _batch_sizes(text: str) -> list[int]:
    sizes = parse_batch_sizes(text)
    if not sizes:
        raise argparse.ArgumentTypeError("at least one batch size is needed")
    return sizes


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """Every request's sampling options."""
    return {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
            "min_p": args.min_p}


def run(args: argparse.Namespace) -> int:
    from tokenmill.engine.bench.report import write_json
    from tokenmill.engine.core.sampling_params import SamplingParams, SamplingParamsError

    try:  # before the model is built
        SamplingParams(**_sampling(args))
    except SamplingParamsError as exc:
        print(f"tokenmill bench host-overhead: error: {exc}", file=sys.stderr)
        return 2
    payload = benchmark(args)
    print(format_table(payload))
    if args.json:
        write_json(args.json, payload)
        print(f"raw results: {args.json}")
    return 0


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or load) the model, measure every batch size; return the JSON payload."""
    import torch

    from tokenmill.engine.bench import report

    revision = report.git_revision()  # before the run: the code that is measured
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        payload = _measure_all(args)
        payload["machine"] = report.machine_info(payload.pop("device"))
    finally:
        torch.set_num_threads(threads)
    return {"benchmark": "host-overhead", "command": report.command_line(),
            "args": {k: v for k, v in vars(args).items() if k != "func"},
            "git": revision, **payload}


def _measure_all(args: argparse.Namespace) -> dict[str, Any]:
    from tokenmill.engine import LLM
    from tokenmill.engine.bench import random_model
    from tokenmill.engine.contract.config import engine_config_from_args

    with tempfile.TemporaryDirectory(prefix="tokenmill-host-overhead-") as tmp:
        model = args.model
        if model is None:
            print(f"building a random {args.num_layers}-layer tiny model", file=sys.stderr)
            model = random_model.make_model(random_model.TINY_DEEP, tmp, "float32",
                                            num_hidden_layers=args.num_layers)
        config = engine_config_from_args(argparse.Namespace(**{**vars(args), "model": model}))
        with LLM(**dataclasses.asdict(config), show_progress=False) as llm:
            engine = llm.engine
            num_layers = engine.model_config.num_hidden_layers
            results = [measure(engine, size, args.steps, args.warmup_steps, args.prompt_len,
                               args.output_kind, _sampling(args))
                       for size in args.batch_sizes]
            device = str(engine.device)
    for result in results:
        _per_layer(result, num_layers)
    return {"engine_config": {**dataclasses.asdict(config),
                              "model": args.model or f"random tiny, {num_layers} layers"},
            "device": device, "num_layers": num_layers, "results": results}


def measure(engine: Any, batch_size: int, steps: int, warmup: int,
            prompt_len: int, output_kind: str = "delta",
            sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """`batch_size` distinct prompts (one step, or as many as the token budget needs), then
    `warmup` untimed decode steps, `steps` timed ones and COUNTED_STEPS with the ops counted;
    the requests are then aborted. `sampling`: SamplingParams fields of every request
    (default: greedy)."""
    from tokenmill.engine.bench.engine_run import decode_step
    from tokenmill.engine.core.sampling_params import RequestOutputKind, SamplingParams
    from tokenmill.engine.frontend.heap import frozen_heap

    rng = random.Random(batch_size)
    vocab = engine.model_config.vocab_size
    # Prompts that exceed one step's token budget take several steps, in which the sequences
    # already prefilled decode: their budget leaves room for those steps, and the requests
    # are aborted once measured.
    kind = RequestOutputKind[output_kind.replace("-", "_").upper()]
    params = SamplingParams(**{"temperature": 0.0, **(sampling or {})}, ignore_eos=True,
                            output_kind=kind,
                            max_tokens=engine.max_model_len - prompt_len)
    ids = [f"host-overhead-{batch_size}-{i}" for i in range(batch_size)]
    for request_id in ids:
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_len)]
        engine.add_request(request_id, prompt, params)
    prefill_steps = _prefill(engine, batch_size)
    for _ in range(warmup):
        decode_step(engine, batch_size)

    runner = engine.runner
    totals = {"execute": 0.0, "forward": 0.0}
    samples: dict[str, list[float]] = {"step_s": [], "execute_s": [], "forward_s": []}
    with (_timed(runner, "execute", totals), _timed(runner.model, "forward", totals),
          frozen_heap()):  # as LLM.generate steps
        for _ in range(steps):
            before = dict(totals)
            start = time.perf_counter()
            decode_step(engine, batch_size)
            samples["step_s"].append(time.perf_counter() - start)
            samples["execute_s"].append(totals["execute"] - before["execute"])
            samples["forward_s"].append(totals["forward"] - before["forward"])

    layers = runner.model.model.layers
    counter = _OpCounter(len(layers))
    with _counting_layers(layers, counter), counter:
        for _ in range(COUNTED_STEPS):
            decode_step(engine, batch_size)
    for request_id in ids:
        engine.abort_request(request_id)
    if engine.has_unfinished_requests():
        raise AssertionError("requests left unfinished after the measured steps")

    step_us = _mean_us(samples["step_s"])
    execute_us = _mean_us(samples["execute_s"])
    forward_us = _mean_us(samples["forward_s"])
    return {
        "batch_size": batch_size,
        "prefill_steps": prefill_steps,
        "steps": steps,
        "step_us": step_us,
        "step_us_p50": _median_us(samples["step_s"]),
        "execute_us": execute_us,
        "forward_us": forward_us,
        "outside_forward_us": step_us - forward_us,
        "outside_execute_us": step_us - execute_us,
        "ops_per_step": counter.total / COUNTED_STEPS,
        "ops_in_layers_per_step": sum(counter.by_layer) / COUNTED_STEPS,
        "ops_by_layer_per_step": [n / COUNTED_STEPS for n in counter.by_layer],
        "op_counts_per_step": {name: n / COUNTED_STEPS
                               for name, n in counter.names.most_common()},
        "samples_us": {name: [s * 1e6 for s in values] for name, values in samples.items()},
    }


def _prefill(engine: Any, batch_size: int) -> int:
    """Step until every prompt is in; return how many steps that took."""
    for taken in range(1, batch_size + 2):
        engine.step()
        if engine.num_waiting == 0 and all(seq.num_computed_tokens >= len(seq.prompt_token_ids)
                                           for seq, _ in engine.last_plan.scheduled):
            return taken
    raise AssertionError(f"{batch_size} prompts not in after {batch_size + 1} steps")


def _per_layer(result: dict[str, Any], num_layers: int) -> None:
    result["step_us_per_layer"] = result["step_us"] / num_layers
    result["forward_us_per_layer"] = result["forward_us"] / num_layers
    result["ops_per_layer"] = result["ops_in_layers_per_step"] / num_layers
    result["ops_outside_layers_per_step"] = (result["ops_per_step"]
                                             - result["ops_in_layers_per_step"])


@contextlib.contextmanager
def _timed(obj: Any, name: str, totals: dict[str, float]) -> Iterator[None]:
    """Add the time spent in `obj.name` to totals[name] (an instance attribute shadows the
    method; removing it restores the method)."""
    method: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    setattr(obj, name, wrapper)
    try:
        yield
    finally:
        delattr(obj, name)


class _OpCounter:
    """Counts the aten ops dispatched while active: in all, by name, and inside each decoder
    layer (`layer` is set by _counting_layers' hooks)."""

    def __init__(self, num_layers: int) -> None:
        self.total = 0
        self.by_layer = [0] * num_layers
        self.layer: int | None = None
        self.names: collections.Counter[str] = collections.Counter()
        self._mode: Any = None

    def __enter__(self) -> _OpCounter:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.total += 1
                if counter.layer is not None:
                    counter.by_layer[counter.layer] += 1
                counter.names[str(func.overloadpacket)] += 1
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


@contextlib.contextmanager
def _counting_layers(layers: Any, counter: _OpCounter) -> Iterator[None]:
    """Attribute the ops dispatched inside each of `layers` to it (forward hooks)."""
    def enter(index: int, *_: Any) -> None:
        counter.layer = index

    def leave(*_: Any) -> None:
        counter.layer = None

    handles = [h for i, layer in enumerate(layers)
               for h in (layer.register_forward_pre_hook(functools.partial(enter, i)),
                         layer.register_forward_hook(leave))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _mean_us(values: list[float]) -> float:
    return statistics.fmean(values) * 1e6


def _median_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def format_table(payload: dict[str, Any]) -> str:
    header = ("batch", "step µs", "µs/layer-step", "forward µs", "outside forward µs",
              "outside execute µs", "ops/step", "ops/layer")
    rows = [header]
    for r in payload["results"]:
        outside = r["outside_forward_us"]
        rows.append((str(r["batch_size"]), f"{r['step_us']:.0f}",
                     f"{r['step_us_per_layer']:.1f}", f"{r['forward_us']:.0f}",
                     f"{outside:.0f} ({outside / r['step_us']:.0%})",
                     f"{r['outside_execute_us']:.0f}", f"{r['ops_per_step']:.0f}",
                     f"{r['ops_per_layer']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
             for row in rows]
    kind = payload["args"].get("output_kind", "delta")
    return (f"{payload['num_layers']} layers, {kind} outputs, means over timed decode steps\n"
            + "\n".join(lines))
