"""Per-mode comparisons run one engine at a time: on CUDA an engine sizes its KV pool from the
memory free, so one left alive while the next starts would take that one's pool."""

from __future__ import annotations

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
