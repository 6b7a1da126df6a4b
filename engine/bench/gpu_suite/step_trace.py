"""Per-step figures from a torch.profiler trace of engine steps, each step marked by a
record_function range named STEP_RANGE.

The profiler's events are first reduced to plain TraceEvents (name, kind, interval, self time),
so the arithmetic (launches, device kernels, GPU-busy time, host costs) is tested on made-up
CUDA events where there is no GPU. An event belongs to the step whose range its start falls in.

Launches are the host's runtime and driver API calls (cudaLaunchKernel, cuLaunchKernel from
Triton, cudaGraphLaunch for a whole captured graph); device kernels are what the GPU ran, so
under CUDA graphs there are many more kernels than launches.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STEP_RANGE = "tokenmill::decode_step"
OUTSIDE_OPS = "host work outside ops"  # a step range's own self time: Python, scheduling
# Kinds: "op" (aten and other host ops), "runtime" (CUDA runtime and driver calls), "kernel"
# and "copy" (device work), "range" (a step), "device_range" (a range's device side), "other".
HOST_KINDS = ("op", "runtime", "range")
_ACTIVITY_KINDS = {"cpu_op": "op", "cuda_runtime": "runtime", "cuda_driver": "runtime",
                   "kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "copy",
                   "user_annotation": "range", "gpu_user_annotation": "device_range"}


@dataclass(frozen=True)
class TraceEvent:
    name: str
    kind: str
    start_us: float
    end_us: float
    self_us: float = 0.0  # host kinds only: time not spent in a nested event


def trace_events(events: Iterable[Any]) -> list[TraceEvent]:
    """TraceEvents of torch.profiler's FunctionEvents (`prof.events()`)."""
    out = []
    for event in events:
        kind = _kind(event)
        self_us = event.self_cpu_time_total if kind in HOST_KINDS else 0.0
        out.append(TraceEvent(event.name, kind, event.time_range.start, event.time_range.end,
                              self_us))
    return out


def _kind(event: Any) -> str:
    """The event's kind from its activity type; where torch does not give one (before 2.12),
    from its device, its annotation flag and its name."""
    activity = getattr(event, "activity_type", None)
    if activity is not None:
        return _ACTIVITY_KINDS.get(activity, "other")
    annotation = getattr(event, "is_user_annotation", False) or event.name == STEP_RANGE
    if event.device_type.name != "CPU":
        if annotation:
            return "device_range"
        return "copy" if event.name.startswith(("Memcpy", "Memset")) else "kernel"
    if annotation:
        return "range"
    return "runtime" if _is_api_call(event.name) else "op"


def _is_api_call(name: str) -> bool:
    """cudaLaunchKernel (runtime API) or cuLaunchKernel (driver API), not an op's name."""
    return any(name.startswith(prefix) and name[len(prefix):len(prefix) + 1].isupper()
               for prefix in ("cuda", "cu"))


def steps_of(events: list[TraceEvent]) -> list[tuple[TraceEvent, list[TraceEvent]]]:
    """Each step's range with the events that start inside it, in time order."""
    ranges = sorted((e for e in events if e.kind == "range" and e.name == STEP_RANGE),
                    key=lambda e: e.start_us)
    members: list[list[TraceEvent]] = [[] for _ in ranges]
    for event in events:
        if event.kind == "range" and event.name == STEP_RANGE:
            continue
        for i, step in enumerate(ranges):
            if step.start_us <= event.start_us < step.end_us:
                members[i].append(event)
                break
    return list(zip(ranges, members, strict=True))


def step_figures(events: list[TraceEvent], device_traced: bool) -> list[dict[str, Any]]:
    """One dict a step: wall time, launches by API call, device kernels and copies, the
    fraction of the wall time some kernel ran (None where the device was not traced) and the
    aten ops the host dispatched (nested ones included)."""
    figures = []
    for step, members in steps_of(events):
        wall = step.end_us - step.start_us
        runtime = [e.name for e in members if e.kind == "runtime"]
        launches = collections.Counter(n for n in runtime if _is_launch(n))
        kernels = [e for e in members if e.kind == "kernel"]
        busy = union_us([(e.start_us, e.end_us) for e in kernels], step.start_us, step.end_us)
        figures.append({
            "wall_us": wall,
            "launch_calls": dict(launches),
            "kernel_launches": sum(n for name, n in launches.items() if "LaunchKernel" in name),
            "graph_launches": sum(n for name, n in launches.items() if "GraphLaunch" in name),
            "runtime_calls": len(runtime),
            "device_kernels": len(kernels),
            "device_kernel_us": sum(e.end_us - e.start_us for e in kernels),
            "device_copies": sum(1 for e in members if e.kind == "copy"),
            "gpu_busy_fraction": busy / wall if device_traced and wall > 0 else None,
            "aten_ops": sum(1 for e in members if e.kind == "op" and e.name.startswith("aten::")),
        })
    return figures


def _is_launch(name: str) -> bool:
    return "LaunchKernel" in name or "GraphLaunch" in name


def union_us(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Microseconds of [start, end) covered by at least one of the intervals."""
    covered = 0.0
    reached = start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reached), min(hi, end)
        if hi > lo:
            covered += hi - lo
            reached = hi
    return covered


def top_device_kernels(events: list[TraceEvent], limit: int = 12) -> list[dict[str, Any]]:
    """The kernels the GPU spent the steps' time in, by name: device time and runs per step
    (names cut at their argument list: C++ kernels' names carry their template arguments)."""
    entries = [[(kernel_name(e.name), e.end_us - e.start_us) for e in members
                 if e.kind == "kernel"] for _, members in steps_of(events)]
    return _per_step(entries, limit, "device_us_per_step", "runs_per_step")


def kernel_name(name: str, width: int = 120) -> str:
    """A kernel's name without its argument list, at most `width` characters."""
    return name.split("(", 1)[0][:width]


def top_host_costs(events: list[TraceEvent], limit: int = 10) -> list[dict[str, Any]]:
    """The host's costliest names over the steps, by self time per step: ops, runtime calls,
    and the steps' own time outside any op (OUTSIDE_OPS)."""
    entries = [[(OUTSIDE_OPS, step.self_us)] + [(e.name, e.self_us) for e in members
                                                if e.kind in HOST_KINDS]
               for step, members in steps_of(events)]
    return _per_step(entries, limit, "self_us_per_step", "calls_per_step")


def _per_step(steps: list[list[tuple[str, float]]], limit: int, time_key: str,
              count_key: str) -> list[dict[str, Any]]:
    """The `limit` names of most time, given each step's (name, microseconds) entries: their
    time and their entries per step."""
    if not steps:
        return []
    total_us: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for entries in steps:
        for name, us in entries:
            total_us[name] += us
            count[name] += 1
    return [{"name": name, time_key: total / len(steps), count_key: count[name] / len(steps)}
            for name, total in total_us.most_common(limit)]
