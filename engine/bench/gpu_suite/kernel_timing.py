"""Device time of one kernel call, free of the launcher's host cost and of cache hits.

A Triton launch costs tens of microseconds of Python, as long as a small kernel runs: calls
timed back to back would measure the launcher. On CUDA the calls are captured into one CUDA
graph (as the engine runs them at decode) and the graph's replays are timed with events. The
inputs rotate over copies (`rotation`) so that the calls together read more than a GPU's L2
holds, as a model's layers do. On the CPU (dry runs) the calls are timed with the wall clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

CACHE_FLUSH_BYTES = 256 << 20  # several times a large GPU's L2


def rotation(bytes_per_copy: int, on_cuda: bool, most: int = 64) -> int:
    """How many copies of a call's inputs to cycle through: together past CACHE_FLUSH_BYTES
    on a GPU (at most `most`), one on the CPU."""
    if not on_cuda:
        return 1
    return max(1, min(most, -(-CACHE_FLUSH_BYTES // max(1, bytes_per_copy))))


def time_call(call: Callable[[int], Any], device: Any, calls: int = 20,
              repeats: int = 3) -> float:
    """Median seconds per call(i), i = 0, 1, ... (the input copy to use), over `repeats` runs
    of `calls` calls, after untimed calls (the first compiles)."""
    import torch

    if torch.device(device).type != "cuda":
        call(0)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(calls):
                call(i)
            samples.append((time.perf_counter() - start) / calls)
        return statistics.median(samples)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # capture wants every kernel warmed up off the graph
        for i in range(min(calls, 3)):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    graph.replay()  # first replay uploads the graph
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(samples)
