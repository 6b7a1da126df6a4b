"""Run the workload through tokenmill, one engine step at a time, so the KV cache can be watched.

This is the loop `LLM.generate` runs, driven here so that KVCacheStats can be sampled after
every step; the time spent sampling is measured and reported so it can be told apart. The
pool's counters are read after every step; its waste only while counting it has taken at most
STATS_SHARE of the run so far: where blocks are shared, the count walks every block table,
which at a batch of hundreds of long sequences costs a large part of a host-bound step
(docs/benchmarks.md), and the sampling must stay out of the throughput it reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from tokenmill.engine.bench.decode_bound import DecodeStep
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.core.outputs import RequestOutput
from tokenmill.engine.core.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.engine.core.structured import StructuredOutputsParams
from tokenmill.engine.frontend.heap import frozen_heap

STATS_SHARE = 0.01  # the most of a run's time that counting the KV pool's used slots may take


@dataclass
class StepSample:
    """One engine step: its duration, its batch and the KV-cache fill after it. decode_batch is
    the number of sequences when every one fed a single token (0 otherwise); context_tokens sums
    the tokens each scheduled sequence attends to (its KV after the step); waste is None on the
    steps whose used slots were not counted (STATS_SHARE)."""

    step_s: float
    num_tokens: int | None
    num_running: int
    num_waiting: int
    used_blocks: int
    usage: float
    waste: float | None
    decode_batch: int = 0
    context_tokens: int = 0


@dataclass
class EngineRun:
    elapsed_s: float
    requests: list[dict[str, Any]]
    steps: list[StepSample] = field(default_factory=list)
    num_preemptions: int = 0
    stats_overhead_s: float = 0.0


def params_for(request: BenchRequest) -> SamplingParams:
    """Greedy, exactly output_len tokens, and only the final output reported (what
    LLM.generate asks for: a benchmark reads nothing before a request finishes)."""
    constraint = (None if request.json_schema is None
                  else StructuredOutputsParams(json=request.json_schema))
    return SamplingParams(temperature=0.0, max_tokens=request.output_len, ignore_eos=True,
                          structured_outputs=constraint,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def warm_up(llm: Any, prompt: list[int]) -> None:
    """A short generation over a prompt of the workload's length and a tiny one beside it, so
    that first-call costs aren't timed: the allocator's, and the Triton kernels' compiles,
    which are per shape class (a prompt of many tokens compiles variants a tiny one does not).
    The prompt goes in reversed, so the prefix cache gives the timed run nothing."""
    llm.generate([prompt[::-1], prompt[:3]],
                 SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))


def run_engine(llm: Any, workload: list[BenchRequest], show_progress: bool = True) -> EngineRun:
    """Submit every request at once, step until all finish, time the whole with perf_counter."""
    engine = llm.engine
    preemptions_before = engine.scheduler.num_preemptions
    ids = [f"bench-{i}" for i in range(len(workload))]
    done: dict[str, RequestOutput] = {}
    steps: list[StepSample] = []
    stats_time = 0.0
    total_tokens = sum(r.output_len for r in workload)
    bar = tqdm(total=total_tokens, desc="tokenmill", unit="tok", disable=not show_progress)
    # Under async scheduling a step's device work is meant to run on into the next step's
    # host work: waiting for it between steps would time a synchronous engine.
    sync = (synchronizer(engine.device) if not getattr(engine, "async_scheduling", False)
            else lambda: None)
    with frozen_heap():  # as LLM.generate runs
        start = time.perf_counter()
        for request_id, request in zip(ids, workload, strict=True):
            engine.add_request(request_id, request.prompt_token_ids, params_for(request))
        while engine.has_unfinished_requests():
            sync()  # a step that sampled nothing may leave device work behind, not this one's
            step_start = time.perf_counter()
            outputs = engine.step()
            step_s = time.perf_counter() - step_start
            for out in outputs:
                if out.finished:
                    done[out.request_id] = out
                    bar.update(len(out.outputs[0].token_ids))
            t = time.perf_counter()
            stats = engine.kv_cache_stats(slots=stats_time <= STATS_SHARE * (t - start))
            plan = getattr(engine, "last_plan", None)
            num_tokens = plan.num_tokens if plan is not None else None
            steps.append(StepSample(step_s, num_tokens, engine.num_running, engine.num_waiting,
                                    stats.used_blocks, stats.usage, stats.waste,
                                    *_composition(plan)))
            stats_time += time.perf_counter() - t
        elapsed = time.perf_counter() - start
    bar.close()
    records = [_record(i, request, done[request_id])
               for i, (request_id, request) in enumerate(zip(ids, workload, strict=True))]
    return EngineRun(elapsed, records, steps,
                     engine.scheduler.num_preemptions - preemptions_before, stats_time)


def decode_steps(run: EngineRun) -> list[DecodeStep]:
    """The run's pure decode steps, for the bandwidth bound."""
    return [DecodeStep(s.step_s, s.decode_batch, s.context_tokens)
            for s in run.steps if s.decode_batch]


def _composition(plan: Any) -> tuple[int, int]:
    """(decode batch, attended tokens) of a step's plan, read after the step has run."""
    if plan is None or not plan.scheduled:
        return 0, 0
    context = sum(seq.num_computed_tokens for seq, _ in plan.scheduled)
    decode = all(num_new == 1 for _, num_new in plan.scheduled)
    return (len(plan.scheduled) if decode else 0), context


def decode_step(engine: Any, batch_size: int) -> None:
    """One engine step, which must be a decode step of `batch_size` sequences."""
    engine.step()
    check_decode_step(engine, batch_size)


def check_decode_step(engine: Any, batch_size: int) -> None:
    """AssertionError unless the latest step fed one token to each of `batch_size` sequences."""
    scheduled = engine.last_plan.scheduled
    if len(scheduled) != batch_size or any(n != 1 for _, n in scheduled):
        raise AssertionError(f"expected a decode step of {batch_size} sequences, got "
                             f"{[n for _, n in scheduled]} new tokens")


def synchronizer(device: Any) -> Callable[[], None]:
    """Wait for the device's queued work (CUDA); nothing to wait for on CPU."""
    if getattr(device, "type", "cpu") != "cuda":
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(device)


def _record(index: int, request: BenchRequest, out: RequestOutput) -> dict[str, Any]:
    produced = len(out.outputs[0].token_ids)
    if produced != request.output_len:
        raise AssertionError(f"request {index} produced {produced} tokens, asked for "
                             f"{request.output_len} (ignore_eos is set)")
    t = out.timings
    return {
        "index": index,
        "input_len": request.input_len,
        "output_len": produced,
        "ttft_s": t.time_to_first_token,
        "e2e_s": t.e2e_latency,
        "queue_s": t.queue_time,
        "num_preemptions": out.num_preemptions,
    }
