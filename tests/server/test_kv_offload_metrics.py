"""The host tier's metrics follow the engine: prefix hits by tier, bytes copied each way and
the tier's usage, read from a real engine after real steps."""

from __future__ import annotations

import random

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.execution.kv_layout import KVCacheLayout
from tokenmill.engine.server.metrics import EngineMetrics


def test_offload_metrics_count_hits_by_tier_bytes_and_usage(tiny_llama_dir):
    import torch
    from transformers import AutoConfig

    layout = KVCacheLayout.for_model(AutoConfig.from_pretrained(tiny_llama_dir), 16,
                                     torch.float32)
    block = layout.bytes_per_block
    llm = LLM(tiny_llama_dir, show_progress=False, kv_cache_memory=6 * block,
              kv_offloading_size=32 * block / (1 << 30))
    metrics = EngineMetrics("tiny")
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 30000) for _ in range(40)] for _ in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for prompt in prompts + prompts:  # the second round finds its prefixes in host memory
        llm.generate([prompt], params)
        metrics.observe_step(llm.engine, [])
    kv, host = llm.engine.kv, llm.engine.kv.host

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {"model_name": "tiny", **labels})

    assert host.blocks_loaded > 0 and kv.host_prefix_hits > 0
    assert sample("tokenmill_kv_offload_prefix_hits_total", tier="host") == kv.host_prefix_hits
    assert (sample("tokenmill_kv_offload_prefix_hits_total", tier="device")
            == kv.prefix_hits - kv.host_prefix_hits)
    assert sample("tokenmill_kv_offload_bytes_total", direction="to_host") == \
        host.blocks_offloaded * block
    assert sample("tokenmill_kv_offload_bytes_total", direction="to_device") == \
        host.blocks_loaded * block
    assert sample("tokenmill_kv_offload_host_usage_ratio") == host.num_used / 32
    assert sample("tokenmill_kv_offload_host_capacity_tokens") == 32 * 16


def test_preempted_work_is_counted_by_where_it_came_back_from(tiny_llama_dir):
    import torch
    from transformers import AutoConfig

    layout = KVCacheLayout.for_model(AutoConfig.from_pretrained(tiny_llama_dir), 16,
                                     torch.float32)
    block = layout.bytes_per_block
    llm = LLM(tiny_llama_dir, show_progress=False, kv_cache_memory=8 * block,
              max_num_seqs=4, max_num_batched_tokens=32,
              kv_offloading_size=64 * block / (1 << 30))
    metrics = EngineMetrics("tiny")
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 30000) for _ in range(40)] for _ in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    llm.generate(prompts, params)
    metrics.observe_step(llm.engine, [])
    resumed = llm.engine.scheduler.resumed_tokens
    assert resumed.readmissions > 0 and resumed.host > 0

    def sample(source: str) -> float:
        return metrics.registry.get_sample_value("tokenmill_preempted_tokens_total",
                                                 {"model_name": "tiny", "source": source})

    assert sample("device") == resumed.device
    assert sample("host") == resumed.host
    assert sample("recomputed") == resumed.recomputed
