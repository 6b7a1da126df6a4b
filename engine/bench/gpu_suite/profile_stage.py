"""Stage `profile`: torch.profiler over decode steps at batch 1 and batch 256 (a dry run: 1 and
8), once with the CUDA graphs the engine captures by default (part `graphs`) and once with
--enforce-eager (part `eager`), and over prefill steps of one whole token budget (part
`prefill`: one new prompt of --max-num-batched-tokens tokens a step). Per profiled step: the
wall time, the launches the host made by API call (cudaLaunchKernel, cuLaunchKernel,
cudaGraphLaunch), the kernels the GPU ran, the fraction of the step some kernel was running,
the aten ops dispatched; per batch the host's top costs by self time and the GPU's top
kernels by device time (step_trace.py reads the trace), and the Python functions with the
most self time over as many more steps under cProfile (python_profile.py).

A batch's requests (random prompts, long outputs, ignore_eos) are added at once and the engine
is stepped until every sequence decodes; then come warm-up steps, timed steps without the
profiler (what a step takes unobserved) and the profiled steps, each in its own range with
the device idle at its start. The requests are then aborted. On the CPU only the host is
traced: launches and kernels are 0 and the busy fraction is None.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench.engine_run import check_decode_step, synchronizer
from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status
from tokenmill.engine.bench.gpu_suite.engines import start_llm
from tokenmill.engine.bench.gpu_suite.python_profile import top_python
from tokenmill.engine.bench.gpu_suite.step_trace import (
    STEP_RANGE,
    TraceEvent,
    step_figures,
    top_device_kernels,
    top_host_costs,
    trace_events,
)
from tokenmill.engine.bench.gpu_suite.suite import selected

PARTS = ["graphs", "eager", "prefill"]
MAX_OUTPUT = 4096  # tokens a request may generate: more than the steps it is run for
DRY_RUN_KV_MEMORY = 32 << 20  # the CPU's default pool (1 GiB) is far more than a dry run needs


@dataclasses.dataclass(frozen=True)
class Workload:
    batch_sizes: tuple[int, ...]
    prompt_len: int
    warmup_steps: int
    timed_steps: int
    profiled_steps: int
    prefill_tokens: int | None  # a prefill step's prompt (None: the engine's token budget)


FULL = Workload(batch_sizes=(1, 256), prompt_len=512, warmup_steps=5, timed_steps=20,
                profiled_steps=3, prefill_tokens=None)
DRY_RUN = Workload(batch_sizes=(1, 8), prompt_len=16, warmup_steps=1, timed_steps=3,
                   profiled_steps=2, prefill_tokens=64)


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    workload = DRY_RUN if ctx.dry_run else FULL
    result: dict[str, Any] = {"device": ctx.device, "dtype": ctx.dtype,
                              **dataclasses.asdict(workload), "runs": []}
    for part in selected(PARTS, args.only):
        result["runs"] += _profile_part(ctx, part, workload)
        ctx.write("profile", result)
    return 0


def _profile_part(ctx: SuiteContext, part: str, workload: Workload) -> list[dict[str, Any]]:
    options: dict[str, Any] = {"enforce_eager": part == "eager"}
    if ctx.dry_run:
        options["kv_cache_memory"] = DRY_RUN_KV_MEMORY
    runs = []
    with start_llm(ctx, **options) as llm:
        engine = llm.engine
        for batch_size in (1,) if part == "prefill" else workload.batch_sizes:
            figures = (profile_prefill(engine, workload) if part == "prefill"
                       else profile_batch(engine, batch_size, workload))
            runs.append({"part": part, "enforce_eager": options["enforce_eager"],
                         "cuda_graphs": engine.runner.graphs is not None, **figures})
            _say(part, figures)
    return runs


def profile_batch(engine: Any, batch_size: int, workload: Workload) -> dict[str, Any]:
    """Warm-up, timed and profiled decode steps of `batch_size` sequences on `engine`."""
    ids = _add_requests(engine, batch_size, workload.prompt_len)
    _step_until_decoding(engine, batch_size, workload.prompt_len)
    measured = _measured_steps(engine, workload, lambda: None,
                               lambda: check_decode_step(engine, batch_size))
    for request_id in ids:
        engine.abort_request(request_id)
    return {"batch_size": batch_size, **_figures(engine, measured),
            "graph_replays_per_step": measured.replays / workload.profiled_steps}


def profile_prefill(engine: Any, workload: Workload) -> dict[str, Any]:
    """Warm-up, timed and profiled steps that each prefill one new prompt of the whole token
    budget (random tokens: the prefix cache finds nothing)."""
    from tokenmill.engine.core.sampling_params import SamplingParams

    tokens = workload.prefill_tokens or engine.config.max_num_batched_tokens
    rng = random.Random(tokens)
    vocab = engine.model_config.vocab_size
    request_id = "profile-prefill"

    def add_prompt() -> None:
        engine.add_request(request_id, [rng.randrange(10, vocab) for _ in range(tokens)],
                           SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))

    def check_and_end() -> None:
        if [n for _, n in engine.last_plan.scheduled] != [tokens]:
            raise AssertionError(f"expected one prefill of {tokens} tokens, got "
                                 f"{engine.last_plan.scheduled}")
        engine.abort_request(request_id)  # finished already, unless a stop was missed

    measured = _measured_steps(engine, workload, add_prompt, check_and_end)
    return {"batch_size": 1, "prefill_tokens": tokens, **_figures(engine, measured)}


@dataclasses.dataclass
class _Measured:
    samples: list[float]        # the timed steps' microseconds
    events: list[TraceEvent]    # the profiled steps' trace
    replays: int                # graph replays the profiled steps made
    python: list[dict[str, Any]]  # python_profile.top_python over as many more steps


def _measured_steps(engine: Any, workload: Workload, before: Callable[[], None],
                    after: Callable[[], None]) -> _Measured:
    """Warm-up, timed (unprofiled), profiled and cProfiled engine steps, each between
    `before` and `after` (which neither the timing nor the step's range covers), the device
    idle at each step's start."""
    from torch.profiler import ProfilerActivity, profile, record_function

    sync = synchronizer(engine.device)

    def one_step(profiled: bool = False, python: cProfile.Profile | None = None) -> float:
        before()
        sync()  # no earlier device work runs inside the step's time or range
        start = time.perf_counter()
        if profiled:
            with record_function(STEP_RANGE):
                engine.step()
        elif python is not None:
            python.enable()
            engine.step()
            python.disable()
        else:
            engine.step()
        sync()
        elapsed = (time.perf_counter() - start) * 1e6
        after()
        return elapsed

    for _ in range(workload.warmup_steps):
        one_step()
    samples = [one_step() for _ in range(workload.timed_steps)]
    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    replays_before = _graph_replays(engine)
    with profile(activities=activities) as prof:
        for _ in range(workload.profiled_steps):
            one_step(profiled=True)
    replays = _graph_replays(engine) - replays_before
    python = cProfile.Profile()
    for _ in range(workload.profiled_steps):
        one_step(python=python)
    return _Measured(samples, trace_events(prof.events()), replays,
                     top_python(python, workload.profiled_steps))


def _figures(engine: Any, measured: _Measured) -> dict[str, Any]:
    """A batch's figures: unprofiled step times, then per profiled step and over them."""
    steps = step_figures(measured.events, device_traced=engine.device.type == "cuda")
    samples = measured.samples
    return {"step_us": {"mean": statistics.fmean(samples), "median": statistics.median(samples),
                        "samples": samples},
            "steps": steps, "mean": _means(steps),
            "top_host_costs": top_host_costs(measured.events),
            "top_device_kernels": top_device_kernels(measured.events),
            "top_python": measured.python}


def _add_requests(engine: Any, batch_size: int, prompt_len: int) -> list[str]:
    from tokenmill.engine.core.sampling_params import SamplingParams

    rng = random.Random(batch_size)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, ignore_eos=True,
                            max_tokens=min(MAX_OUTPUT, engine.max_model_len - prompt_len))
    ids = [f"profile-{batch_size}-{i}" for i in range(batch_size)]
    for request_id in ids:
        engine.add_request(request_id, [rng.randrange(10, vocab) for _ in range(prompt_len)],
                           params)
    return ids


def _step_until_decoding(engine: Any, batch_size: int, prompt_len: int) -> None:
    """Step through the prompts (chunked by the token budget, which the sequences already
    decoding share) until a step decodes them all."""
    prompt_budget = max(1, engine.config.max_num_batched_tokens - batch_size)
    limit = 8 + 2 * -(-batch_size * prompt_len // prompt_budget)
    for _ in range(limit):
        engine.step()
        plan = engine.last_plan
        if len(plan.scheduled) == batch_size and all(n == 1 for _, n in plan.scheduled):
            return
    raise AssertionError(f"{batch_size} sequences were not all decoding after {limit} steps")


def _graph_replays(engine: Any) -> int:
    graphs = engine.runner.graphs
    return graphs.replays if graphs is not None else 0


def _means(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each numeric figure's mean over the profiled steps (None stays None)."""
    names = ("wall_us", "kernel_launches", "graph_launches", "runtime_calls", "device_kernels",
             "device_kernel_us", "gpu_busy_fraction", "aten_ops")
    return {name: None if any(s[name] is None for s in steps)
            else statistics.fmean(s[name] for s in steps) for name in names}


def _say(part: str, figures: dict[str, Any]) -> None:
    mean = figures["mean"]
    busy = mean["gpu_busy_fraction"]
    what = (f"{figures['prefill_tokens']} tokens" if "prefill_tokens" in figures
            else f"batch {figures['batch_size']}")
    status(f"profile {part} {what}: "
           f"{figures['step_us']['median']:.0f} us/step unprofiled, "
           f"{mean['kernel_launches']:.0f} kernel launches + {mean['graph_launches']:.0f} graph "
           f"launches, {mean['device_kernels']:.0f} kernels, {mean['aten_ops']:.0f} aten ops, "
           f"GPU busy {'-' if busy is None else f'{busy:.0%}'}")
