"""Continuous batching: batch invariance, staggered arrivals, preemption, limits, no leaks."""

from __future__ import annotations

import random

import pytest
from engine_support import tiny_llama_block_bytes

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.core.engine import LLMEngine


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randrange(1, 60))] for _ in range(count)]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _alone(llm: LLM, prompts, lengths) -> list[list[int]]:
    return [llm.generate([p], _greedy(n))[0].outputs[0].token_ids
            for p, n in zip(prompts, lengths, strict=True)]


def _run_staggered(engine: LLMEngine, prompts, lengths, arrivals) -> dict[str, list[int]]:
    """Add request i just before step arrivals[i]; step until all are done."""
    done: dict[str, list[int]] = {}
    step = 0
    pending = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts[i], _greedy(lengths[i]))
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        step += 1
    return done


def test_output_does_not_depend_on_batch_or_arrival_time(tiny_llama):
    prompts = _prompts(10)
    lengths = [5 + 3 * i for i in range(10)]
    alone = _alone(tiny_llama, prompts, lengths)
    together = [o.outputs[0].token_ids
                for o in tiny_llama.generate(prompts, [_greedy(n) for n in lengths])]
    assert together == alone
    staggered = _run_staggered(tiny_llama.engine, prompts, lengths,
                               arrivals=[0, 0, 2, 3, 3, 7, 11, 12, 20, 31])
    assert [staggered[f"r{i}"] for i in range(10)] == alone
    tiny_llama.engine.kv.allocator.check_all_free()


def test_finished_requests_leave_and_their_seats_are_refilled(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=2, max_num_batched_tokens=64)
    engine = llm.engine
    for i, n in enumerate([2, 6, 6]):
        engine.add_request(f"r{i}", [100 + i, 200, 300], _greedy(n))
    batch_sizes = []
    while engine.has_unfinished_requests():
        engine.step()
        batch_sizes.append(engine.num_running)
        assert engine.num_running <= 2
    # r0 finishes after 2 tokens; r2 takes its seat on the next step, not after r1 ends.
    assert batch_sizes[:3] == [2, 1, 2]


def test_preemption_by_recompute_keeps_outputs(tiny_llama_dir, tiny_llama):
    prompts = _prompts(6, seed=1)
    lengths = [40] * 6
    expected = _alone(tiny_llama, prompts, lengths)
    # 12 blocks of 8 tokens: one request (<= 100 tokens) fits, six at once do not.
    small = LLM(tiny_llama_dir, show_progress=False, block_size=8,
                kv_cache_memory=12 * tiny_llama_block_bytes(tiny_llama, 8))
    assert small.engine.kv.allocator.num_blocks == 12
    outputs = small.generate(prompts, [_greedy(n) for n in lengths])
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert small.engine.scheduler.num_preemptions > 0
    assert sum(o.num_preemptions for o in outputs) == small.engine.scheduler.num_preemptions
    small.engine.kv.allocator.check_all_free()


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget(tiny_llama_dir, tiny_llama):
    prompt = _prompts(1, seed=3)[0] * 5
    expected = _alone(tiny_llama, [prompt], [8])
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_batched_tokens=16, max_num_seqs=4)
    engine = llm.engine
    engine.add_request("long", prompt, _greedy(8))
    engine.add_request("short", [5, 6, 7], _greedy(8))
    steps, result = 0, {}
    while engine.has_unfinished_requests():
        plan_tokens_before = sum(s.num_computed_tokens for s in engine.scheduler.running)
        for out in engine.step():
            result[out.request_id] = out.outputs[0].token_ids
        plan_tokens_after = sum(s.num_computed_tokens for s in engine.scheduler.running)
        assert plan_tokens_after - plan_tokens_before <= 16 or steps == 0
        steps += 1
    assert steps > len(prompt) // 16
    assert result["long"] == expected[0]


def test_logits_are_computed_only_for_rows_that_sample(tiny_llama_dir, tiny_llama, monkeypatch):
    """A prompt chunk with more of its prompt to come samples nothing: the step computes (and
    the sampler gathers) no logits for it, only for the sequences whose next token it draws."""
    prompt = _prompts(1, seed=3)[0] * 5
    expected = _alone(tiny_llama, [prompt, [5, 6, 7]], [8, 8])
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_batched_tokens=16, max_num_seqs=4)
    engine = llm.engine
    rows: list[tuple[int, int, int]] = []  # logit rows, sequences sampling, sequences
    execute = engine.runner.execute

    def recorded(inputs):
        logits = execute(inputs)
        plan = engine.last_plan.scheduled
        sampling = sum(s.num_computed_tokens + n == s.num_tokens for s, n in plan)
        rows.append((logits.shape[0], sampling, len(plan)))
        return logits

    monkeypatch.setattr(engine.runner, "execute", recorded)
    engine.add_request("long", prompt, _greedy(8))
    engine.add_request("short", [5, 6, 7], _greedy(8))
    result = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            result[out.request_id] = out.outputs[0].token_ids
    assert all(got == sampling for got, sampling, _ in rows), rows
    assert any(got < scheduled for got, _, scheduled in rows)  # a chunk beside a decode
    assert [result["long"], result["short"]] == expected


def test_a_long_prompt_is_capped_per_step_so_a_short_one_starts_beside_it(tiny_llama_dir,
                                                                          tiny_llama):
    """vLLM's --long-prefill-token-threshold: the long prompt computes at most 8 tokens a
    step, so the short prompt queued after it is prefilled, and samples, in the first step;
    without the cap the long one takes the whole budget. Output is unchanged."""
    long, short = _prompts(1, seed=3)[0] * 4, [5, 6, 7]
    expected = _alone(tiny_llama, [long, short], [4, 4])
    for threshold, short_first in ((8, True), (0, False)):
        llm = LLM(tiny_llama_dir, show_progress=False, max_num_batched_tokens=32,
                  max_num_seqs=4, long_prefill_token_threshold=threshold)
        engine = llm.engine
        engine.add_request("long", long, _greedy(4))
        engine.add_request("short", short, _greedy(4))
        assert len(long) > 32
        first = {out.request_id: len(out.outputs[0].token_ids) for out in engine.step()}
        assert (first.get("short") == 1) is short_first, threshold
        if threshold:
            assert engine.scheduler.running[0].num_computed_tokens == 8
        result = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                result[out.request_id] = out.outputs[0].token_ids
        assert [result["long"], result["short"]] == expected
        llm.shutdown()
    with pytest.raises(ConfigError, match="long_prefill_token_threshold: splits prompts"):
        EngineConfig(long_prefill_token_threshold=8, enable_chunked_prefill=False,
                     max_num_batched_tokens=4096)


def test_without_chunked_prefill_every_prompt_is_prefilled_in_one_step(tiny_llama_dir,
                                                                       tiny_llama):
    """vLLM's --no-enable-chunked-prefill: a prompt waits until it fits a step's budget
    whole; greedy output is unchanged."""
    prompts = [p * 3 for p in _prompts(4, seed=5)]
    lengths = [6, 9, 4, 7]
    expected = _alone(tiny_llama, prompts, lengths)
    budget = max(len(p) for p in prompts) + 8
    llm = LLM(tiny_llama_dir, show_progress=False, enable_chunked_prefill=False,
              max_model_len=budget, max_num_batched_tokens=budget, max_num_seqs=4)
    engine = llm.engine
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", prompt, _greedy(n))
    result, waited = {}, False
    while engine.has_unfinished_requests():
        before = {s.request_id: s.num_computed_tokens for s in engine.scheduler.running}
        waited |= bool(engine.scheduler.waiting) and bool(engine.scheduler.running)
        for out in engine.step():
            if out.finished:
                result[out.request_id] = out.outputs[0].token_ids
        for seq in engine.scheduler.running:
            if seq.request_id not in before:  # admitted this step: its whole prompt ran
                assert seq.num_computed_tokens >= len(seq.prompt_token_ids)
    assert waited  # the budget held back a prompt that chunking would have started
    assert [result[f"r{i}"] for i in range(4)] == expected
    engine.kv.allocator.check_all_free()


def test_without_chunked_prefill_the_budget_must_hold_the_context(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens: \(512\) must be at least "
                                          r"the context length \(1024\) without chunked"):
        LLM(tiny_llama_dir, show_progress=False, enable_chunked_prefill=False,
            max_num_batched_tokens=512)


def test_abort_frees_blocks_at_once_and_others_continue(tiny_llama):
    engine = tiny_llama.engine
    prompts = _prompts(3, seed=2)
    expected = _alone(tiny_llama, prompts[1:], [12, 12])
    engine.add_request("victim", prompts[0], _greedy(50))
    engine.add_request("a", prompts[1], _greedy(12))
    engine.add_request("b", prompts[2], _greedy(12))
    for _ in range(3):
        engine.step()
    used = engine.kv.allocator.num_used
    aborted = engine.abort_request("victim")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert engine.kv.allocator.num_used < used
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out.outputs[0].token_ids
    assert [done["a"], done["b"]] == expected
    engine.kv.allocator.check_all_free()
    assert engine.abort_request("victim") is None


def test_kv_waste_is_small_at_steady_state(tiny_llama):
    engine = tiny_llama.engine
    for i, p in enumerate(_prompts(16, seed=4)):
        engine.add_request(f"w{i}", (p * 20)[:300], _greedy(100))
    wastes = []
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.kv_cache_stats()
        if engine.num_running == 16:
            wastes.append(stats.waste)
            # Only each sequence's last block can be partly empty.
            unused = stats.allocated_slots - stats.used_slots
            assert unused <= 16 * (engine.config.block_size - 1)
    assert wastes and sum(wastes) / len(wastes) < 0.04
    engine.kv.allocator.check_all_free()


@pytest.mark.parametrize("n", [2, 3])
def test_n_samples_share_prompt_blocks(tiny_llama, n):
    engine = tiny_llama.engine
    prompt = list(range(100, 140))  # 40 tokens: 2 full blocks and a partial one at 16
    engine.add_request("fan", prompt, SamplingParams(n=n, temperature=1.0, seed=3, max_tokens=6))
    engine.step()
    seqs = engine._requests["fan"].seqs
    assert len(seqs) == n
    full_blocks = seqs[0].block_table[:2]
    assert all(s.block_table[:2] == full_blocks for s in seqs)
    assert all(engine.kv.allocator.ref_count(b) == n for b in full_blocks)
    assert engine.kv.allocator.num_used == 3  # not 3 * n
    while engine.has_unfinished_requests():
        engine.step()
    engine.kv.allocator.check_all_free()
