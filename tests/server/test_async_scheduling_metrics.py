"""Under async scheduling a sequence holds a placeholder for its token still on the device
when a step ends: the server's token counts follow the tokens read back, as the synchronous
engine's do, and an aborted request counts only the tokens it got."""

from __future__ import annotations

import random

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.server.metrics import EngineMetrics


def test_generation_tokens_count_the_tokens_read_back(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=4, async_scheduling=True)
    engine, metrics = llm.engine, EngineMetrics("tiny")
    rng = random.Random(3)
    seqs = []
    for i in range(3):
        engine.add_request(f"r{i}", [rng.randrange(100, 30000) for _ in range(12)],
                           SamplingParams(temperature=0.0, max_tokens=6 + i, ignore_eos=True))
        seqs += engine._requests[f"r{i}"].seqs

    def counted() -> float:
        return metrics.registry.get_sample_value("tokenmill_generation_tokens_total",
                                                 {"model_name": "tiny"}) or 0.0

    def read_back() -> int:
        return sum(token >= 0 for seq in seqs for token in seq.output_token_ids)

    steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        metrics.observe_step(engine, outputs)
        steps += 1
        if steps == 3:  # a token of each request still on the device; r2 aborted then
            assert all(seq.awaits_token for seq in seqs)
            out = engine.abort_request("r2")
            metrics.observe_step(engine, [out])
        assert counted() == read_back()
    assert len(seqs[2].output_token_ids) < 8
    assert counted() == 6 + 7 + len(seqs[2].output_token_ids)
