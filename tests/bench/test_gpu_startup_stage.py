"""`tokenmill bench gpu startup`: the engine's start-up phases and the memory it holds after
start-up, run as a dry run on the CPU (the pool sized by kv_cache_memory there)."""

from __future__ import annotations

import pytest

from tokenmill.engine.bench.gpu_suite import startup_stage

PHASES = ("config_seconds", "tokenizer_seconds", "weights_seconds", "kv_profile_seconds",
          "kv_allocate_seconds", "graph_capture_seconds")


@pytest.fixture(scope="module")
def startup(gpu_dry_run):
    return gpu_dry_run("startup")


def test_dry_run_starts_cold_then_warm_at_each_pool_size(startup):
    assert (startup["stage"], startup["name"], startup["dry_run"]) == ("startup", "startup", True)
    result = startup["result"]
    assert result["device"] == "cpu"
    budgets = list(startup_stage.DRY_RUN_KV_MEMORY)
    assert [(r["part"], r["kv_cache_memory"]) for r in result["runs"]] == [
        ("cold", budgets[0]), *(("warm", b) for b in budgets)]
    assert [r["page_cache"] for r in result["runs"]] == ["dropped", "warm", "warm"]


def test_every_start_reports_its_phases(startup):
    for run in startup["result"]["runs"]:
        phases = run["phases"]
        assert list(phases) == [*PHASES, "total_seconds"]
        assert all(phases[p] >= 0 for p in PHASES)
        assert sum(phases[p] for p in PHASES) <= phases["total_seconds"]
        assert phases["graph_capture_seconds"] == 0 and run["cuda_graphs"] is False
        assert phases["weights_seconds"] >= run["load"]["load_seconds"] > 0
        assert run["gpu_memory_utilization"] is None and run["device_memory"] is None


def test_the_pool_is_what_kv_cache_memory_holds_next_to_the_same_weights(startup):
    runs = startup["result"]["runs"]
    assert len({r["memory"]["weights_bytes"] for r in runs}) == 1
    assert runs[0]["load"]["load_bytes"] >= runs[0]["memory"]["weights_bytes"] > 0
    for run in runs:
        memory = run["memory"]
        block = memory["kv_bytes_per_token"] * 16
        assert run["kv_cache_memory"] - block < memory["kv_pool_bytes"] <= run["kv_cache_memory"]
    assert runs[2]["memory"]["kv_capacity_tokens"] < runs[1]["memory"]["kv_capacity_tokens"]


def test_device_memory_compares_what_is_in_use_with_the_utilization_asked():
    gib = 1 << 30
    figures = startup_stage.device_memory_figures(free=20 * gib, total=80 * gib,
                                                  allocated=50 * gib, reserved=55 * gib,
                                                  utilization=0.9)
    assert figures == {"total_bytes": 80 * gib, "free_bytes": 20 * gib, "used_bytes": 60 * gib,
                       "used_fraction": 0.75, "asked_utilization": 0.9,
                       "unused_of_asked_fraction": pytest.approx(0.15),
                       "torch_allocated_bytes": 50 * gib, "torch_reserved_bytes": 55 * gib}
