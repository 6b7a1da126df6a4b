"""The speculative-decoding counters follow the engine's totals, with vLLM's meanings."""

from __future__ import annotations

import json

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.server.metrics import EngineMetrics


def test_drafts_proposals_and_accepted_tokens_are_counted(tiny_llama_dir):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    llm = LLM(tiny_llama_dir, show_progress=False, kv_cache_memory=16 << 20,
              speculative_config=spec)
    metrics = EngineMetrics("tiny")
    motif = [101, 202, 303, 404, 505]
    llm.generate([motif * 4], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    metrics.observe_step(llm.engine, [])
    stats = llm.engine.speculation_stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {"model_name": "tiny", **labels})

    assert sample("tokenmill_spec_decode_num_drafts_total") == stats.num_drafts
    assert sample("tokenmill_spec_decode_num_draft_tokens_total") == stats.num_draft_tokens
    assert sample("tokenmill_spec_decode_num_accepted_tokens_total") == \
        stats.num_accepted_tokens
    per_position = [sample("tokenmill_spec_decode_num_accepted_tokens_per_pos_total",
                           position=str(p)) for p in range(len(stats.accepted_per_position))]
    assert per_position == stats.accepted_per_position
    assert sum(per_position) == stats.num_accepted_tokens
    assert per_position == sorted(per_position, reverse=True)  # position p needs p-1 accepted


def test_the_counters_exist_at_zero_without_speculation(tiny_llama_dir):
    metrics = EngineMetrics("tiny")
    assert metrics.registry.get_sample_value("tokenmill_spec_decode_num_drafts_total",
                                             {"model_name": "tiny"}) == 0
