"""Per-mode comparisons run one engine at a time: on CUDA an engine sizes its KV pool from the
memory free, so one left alive while the next starts would take that one's pool."""

from __future__ import annotations

import time
import weakref

from tokenmill.engine.bench import ab
from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.core import engine as engine_module


def test_per_mode_builds_each_engine_after_the_one_before_is_gone(tiny_llama_dir, monkeypatch):
    live: weakref.WeakSet = weakref.WeakSet()
    alive_at_start: list[int] = []
    original = engine_module.LLMEngine.__init__

    def counting_init(self, *args, **kwargs):
        alive_at_start.append(len(live))
        live.add(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(engine_module.LLMEngine, "__init__", counting_init)
    config = EngineConfig(model=tiny_llama_dir, device="cpu", dtype="float32",
                          kv_cache_memory=1 << 22, max_model_len=256)
    workload = [BenchRequest(prompt_token_ids=[5, 6, 7, 8], output_len=3)]
    runs = ab.per_mode([config, config.replace(max_num_seqs=2), config.replace(block_size=32)],
                       workload, False, lambda _config, _llm, run: ab.throughput(run()))
    assert [run["throughput_ratio"] > 0 for run in runs] == [True] * 3
    assert alive_at_start == [0, 0, 0]


def test_the_engine_run_waits_for_the_device_between_steps_unless_scheduling_is_async(
        tiny_llama_dir, monkeypatch):
    """Async scheduling overlaps a step's device work with the next step's host work: a
    benchmark that waited for the device between steps would time a synchronous engine."""
    from tokenmill.engine import LLM
    from tokenmill.engine.bench import engine_run

    waits: list[str] = []
    monkeypatch.setattr(engine_run, "synchronizer", lambda device: lambda: waits.append("wait"))
    workload = [BenchRequest(prompt_token_ids=[5, 6, 7, 8], output_len=3),
                BenchRequest(prompt_token_ids=[9, 10], output_len=5)]
    counted = {}
    for overlapped in (False, True):
        waits.clear()
        llm = LLM(tiny_llama_dir, show_progress=False, async_scheduling=overlapped)
        run = engine_run.run_engine(llm, workload, show_progress=False)
        assert len(run.requests) == 2
        counted[overlapped] = (len(waits), len(run.steps))
    assert counted[False][0] == counted[False][1] > 0
    assert counted[True][0] == 0 and counted[True][1] > 0


def test_counting_kv_slots_stays_out_of_the_timed_run(tiny_llama_dir, monkeypatch):
    """Counting the pool's used slots walks every block table: the engine run counts them only
    while doing so has taken at most STATS_SHARE of the run, so a costly count cannot become a
    large part of the throughput it reports. Here each count costs at least 20 ms (a sleep,
    which a loaded machine may stretch but never shortens), several steps: so before a k-th
    count, k - 1 counts have taken at least (k - 1) x 20 ms, which the rule allows only while
    that is within STATS_SHARE of the run."""
    from tokenmill.engine import LLM
    from tokenmill.engine.bench import engine_run, report
    from tokenmill.engine.core.kv_cache.manager import KVCacheManager

    cost_s = 0.02
    original = KVCacheManager.stats

    def costly(self, slots=True):
        if slots:
            time.sleep(cost_s)
        return original(self, slots)

    monkeypatch.setattr(KVCacheManager, "stats", costly)
    workload = [BenchRequest(prompt_token_ids=[5 + i, 6, 7, 8], output_len=40) for i in range(4)]
    llm = LLM(tiny_llama_dir, show_progress=False)
    run = engine_run.run_engine(llm, workload, show_progress=False)
    counted = [s for s in run.steps if s.waste is not None]
    assert run.steps[0].waste is not None and 0 < len(counted) < len(run.steps)
    assert len(counted) <= 1 + engine_run.STATS_SHARE * run.elapsed_s / cost_s
    assert run.stats_overhead_s >= len(counted) * cost_s  # what counting took is reported
    assert all(s.used_blocks > 0 for s in run.steps[:-1])  # the counters, every step
    kv = report.kv_summary(run)
    assert kv["waste_steps"] == len(counted) and 0.0 <= kv["waste_mean"] < 1.0
