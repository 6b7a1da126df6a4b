"""`tokenmill bench gpu profile`: torch.profiler over decode steps. The per-step arithmetic is
checked on made-up CUDA events; the stage itself runs as a dry run on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenmill.engine.bench.gpu_suite.step_trace import (
    STEP_RANGE,
    TraceEvent,
    step_figures,
    top_device_kernels,
    top_host_costs,
    trace_events,
)


def _cuda_trace() -> list[TraceEvent]:
    return [
        TraceEvent(STEP_RANGE, "range", 0, 100, self_us=20),
        TraceEvent("aten::mm", "op", 5, 30, self_us=15),
        TraceEvent("cudaLaunchKernel", "runtime", 10, 14, self_us=4),
        TraceEvent("cudaLaunchKernel", "runtime", 20, 24, self_us=4),
        TraceEvent("cuLaunchKernel", "runtime", 40, 43, self_us=3),
        TraceEvent("cudaStreamSynchronize", "runtime", 60, 95, self_us=35),
        TraceEvent("aten::add", "op", 35, 50, self_us=12),
        TraceEvent("gemm", "kernel", 12, 40),
        TraceEvent("gemm", "kernel", 30, 60),      # overlaps the first: busy 12..60
        TraceEvent("attention", "kernel", 90, 130),  # runs past the step: counted to 100
        TraceEvent("Memcpy DtoH", "copy", 62, 66),
        TraceEvent(STEP_RANGE, "device_range", 12, 100),  # the range's GPU side: not a kernel
        TraceEvent(STEP_RANGE, "range", 200, 250, self_us=30),
        TraceEvent("cudaGraphLaunch", "runtime", 205, 215, self_us=10),
        TraceEvent("aten::mm", "op", 201, 204, self_us=3),
        TraceEvent("kernel_a", "kernel", 210, 220),
        TraceEvent("kernel_b", "kernel", 220, 235),
        TraceEvent("kernel_c", "kernel", 236, 240),
        TraceEvent("aten::mm", "op", 300, 310, self_us=10),  # after the last step: ignored
    ]


def test_launches_kernels_and_busy_time_are_counted_per_step():
    first, second = step_figures(_cuda_trace(), device_traced=True)
    assert first["wall_us"] == 100 and second["wall_us"] == 50
    assert first["launch_calls"] == {"cudaLaunchKernel": 2, "cuLaunchKernel": 1}
    assert (first["kernel_launches"], first["graph_launches"]) == (3, 0)
    assert first["runtime_calls"] == 4
    assert (first["device_kernels"], first["device_copies"]) == (3, 1)
    assert first["gpu_busy_fraction"] == pytest.approx((48 + 10) / 100)
    assert first["aten_ops"] == 2
    assert second["launch_calls"] == {"cudaGraphLaunch": 1}
    assert (second["kernel_launches"], second["graph_launches"]) == (0, 1)
    assert second["device_kernels"] == 3  # a graph's kernels, from one launch
    assert second["gpu_busy_fraction"] == pytest.approx(29 / 50)


def test_without_a_device_trace_the_busy_fraction_is_none():
    trace = [e for e in _cuda_trace() if e.kind in ("range", "op")]
    first, _ = step_figures(trace, device_traced=False)
    assert first["gpu_busy_fraction"] is None
    assert (first["device_kernels"], first["kernel_launches"], first["launch_calls"]) == (0, 0, {})


def test_top_host_costs_are_self_times_per_step_by_name():
    costs = top_host_costs(_cuda_trace(), limit=3)
    assert [c["name"] for c in costs] == ["host work outside ops", "cudaStreamSynchronize",
                                          "aten::mm"]
    assert costs[0]["self_us_per_step"] == 25  # the steps' own time, outside any op
    assert costs[1] == {"name": "cudaStreamSynchronize", "self_us_per_step": 17.5,
                        "calls_per_step": 0.5}
    assert costs[2]["self_us_per_step"] == 9 and costs[2]["calls_per_step"] == 1


def test_top_device_kernels_are_device_times_per_step_by_name():
    trace = _cuda_trace() + [
        TraceEvent("void cutlass::Kernel<cutlass_80_tensorop>(Params)", "kernel", 241, 247)]
    kernels = top_device_kernels(trace, limit=3)
    assert kernels[0] == {"name": "gemm", "device_us_per_step": 29, "runs_per_step": 1}  # 28 + 30
    assert kernels[1] == {"name": "attention", "device_us_per_step": 20, "runs_per_step": 0.5}
    assert kernels[2]["name"] == "kernel_b"  # 15 us in the second step
    names = [k["name"] for k in top_device_kernels(trace, limit=10)]
    assert "void cutlass::Kernel<cutlass_80_tensorop>" in names  # the argument list cut off
    assert "Memcpy DtoH" not in names and STEP_RANGE not in names


def _profiler_event(name, device, start, end, self_us=0.0, annotation=False, **activity):
    """A FunctionEvent's fields as the stage reads them (`activity`: activity_type, which
    torch before 2.12 lacks)."""
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device),
                           time_range=SimpleNamespace(start=start, end=end),
                           self_cpu_time_total=self_us, is_user_annotation=annotation, **activity)


def test_profiler_events_are_sorted_by_kind_with_or_without_activity_types():
    without = [
        _profiler_event(STEP_RANGE, "CPU", 0, 100, 7, annotation=True),
        _profiler_event(STEP_RANGE, "CUDA", 5, 90, annotation=True),
        _profiler_event("aten::mm", "CPU", 1, 9, 4),
        _profiler_event("cudaLaunchKernel", "CPU", 2, 3, 1),
        _profiler_event("cuLaunchKernelEx", "CPU", 3, 4, 1),
        _profiler_event("cudaGraphLaunch", "CPU", 4, 5, 1),
        _profiler_event("ampere_bf16_gemm", "CUDA", 10, 20),
        _profiler_event("Memcpy DtoH (Device -> Pinned)", "CUDA", 20, 21),
        _profiler_event("Memset (Device)", "CUDA", 21, 22),
    ]
    kinds = ["range", "device_range", "op", "runtime", "runtime", "runtime", "kernel", "copy",
             "copy"]
    assert [e.kind for e in trace_events(without)] == kinds
    activities = ["user_annotation", "gpu_user_annotation", "cpu_op", "cuda_runtime",
                  "cuda_driver", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"]
    typed = [SimpleNamespace(**{**vars(e), "activity_type": a})
             for e, a in zip(without, activities, strict=True)]
    assert [e.kind for e in trace_events(typed)] == kinds
    events = trace_events(typed)
    assert (events[0].self_us, events[2].self_us, events[6].self_us) == (7, 4, 0)
    assert (events[6].start_us, events[6].end_us) == (10, 20)


@pytest.fixture(scope="module")
def profile(gpu_dry_run):
    return gpu_dry_run("profile")


def test_dry_run_profiles_both_batches_with_and_without_graphs(profile):
    assert (profile["stage"], profile["name"], profile["dry_run"]) == ("profile", "profile", True)
    result = profile["result"]
    assert result["device"] == "cpu"
    runs = result["runs"]
    assert [(r["part"], r["batch_size"]) for r in runs] == [
        ("graphs", 1), ("graphs", 8), ("eager", 1), ("eager", 8), ("prefill", 1)]
    assert runs[-1]["prefill_tokens"] == 64
    for run in runs:
        assert run["top_device_kernels"] == []  # the CPU's trace has no device side
        assert run["enforce_eager"] == (run["part"] == "eager")
        assert run["cuda_graphs"] is False  # none on the CPU
        assert len(run["steps"]) == result["profiled_steps"] >= 2
        assert run["step_us"]["mean"] > 0 and len(run["step_us"]["samples"]) >= 2
        for step in run["steps"]:
            assert step["wall_us"] > 0 and step["aten_ops"] > 0
            assert step["launch_calls"] == {} and step["device_kernels"] == 0
            assert step["kernel_launches"] == step["graph_launches"] == 0
            assert step["gpu_busy_fraction"] is None
        costs = run["top_host_costs"]
        assert 0 < len(costs) <= 10
        per_step = [c["self_us_per_step"] for c in costs]
        assert per_step == sorted(per_step, reverse=True)
        assert any(c["name"].startswith("aten::") for c in costs)
        python = run["top_python"]
        assert 0 < len(python) <= 15
        own = [f["self_us_per_step"] for f in python]
        assert own == sorted(own, reverse=True)
        assert all(f["cumulative_us_per_step"] >= f["self_us_per_step"] for f in python)
        # The engine's own functions are named by their files in the repository (which of
        # its parts lead depends on the machine: layers here, the core at larger batches).
        assert any(f["function"].startswith("engine/") for f in python), python


def test_op_counts_are_steady_and_host_costs_fit_in_the_step(profile):
    runs = {(r["part"], r["batch_size"]): r for r in profile["result"]["runs"]}
    for run in runs.values():
        counts = {s["aten_ops"] for s in run["steps"]}
        assert len(counts) == 1  # every decode step of a batch dispatches the same ops
        assert counts.pop() > 10 * 2  # more than a handful per layer (the dry run has 2)
        # Self times split a step's host time among its ops and the time outside them.
        host = sum(c["self_us_per_step"] for c in run["top_host_costs"])
        assert host <= run["mean"]["wall_us"] * 1.001
    for part in ("graphs", "eager"):
        # Ops act on the whole batch: eight sequences dispatch about what one does.
        small = runs[part, 1]["steps"][0]["aten_ops"]
        assert small <= runs[part, 8]["steps"][0]["aten_ops"] < 1.5 * small
