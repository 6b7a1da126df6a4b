"""Prefix caching and chunked prefill never change an output, and keep decodes flowing."""

from __future__ import annotations

import random

import pytest

from tokenmill.engine import LLM, SamplingParams


def _greedy(n: int = 12, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **extra)


def _tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def _workloads() -> dict[str, list[list[int]]]:
    rng = random.Random(5)
    system = [rng.randrange(100, 30000) for _ in range(45)]
    turn1 = system + [rng.randrange(100, 30000) for _ in range(9)]
    turn2 = turn1 + [rng.randrange(100, 30000) for _ in range(20)]
    turn3 = turn2 + [rng.randrange(100, 30000) for _ in range(7)]
    base = [rng.randrange(100, 30000) for _ in range(40)]
    return {
        "shared system prompt": [system + [rng.randrange(100, 30000) for _ in range(k)]
                                 for k in (1, 5, 16, 23)],
        "multi-turn history": [turn1, turn2, turn3],
        "diverge mid-block": [base[:21] + [7] * 9, base[:21] + [8] * 9, base[:35] + [9]],
        "identical prompts": [base, base, base],
        "block aligned": [base[:32], base[:32] + [5], base[:16]],
    }


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    """Outputs with the prefix cache off and a large budget, each request alone."""
    llm = LLM(tiny_llama_dir, show_progress=False, enable_prefix_caching=False)
    return {name: [_tokens(llm.generate([p], _greedy()))[0] for p in prompts]
            for name, prompts in _workloads().items()}


@pytest.mark.parametrize("budget", [1, 3, 16, 2048])
def test_cache_on_and_chunk_budgets_keep_greedy_outputs(tiny_llama_dir, reference, budget):
    llm = LLM(tiny_llama_dir, show_progress=False, enable_prefix_caching=True,
              max_num_batched_tokens=budget, max_num_seqs=min(budget, 8))
    for name, prompts in _workloads().items():
        sequential = [_tokens(llm.generate([p], _greedy()))[0] for p in prompts]
        assert sequential == reference[name], name
        batched = _tokens(llm.generate(prompts, _greedy()))
        assert batched == reference[name], name
    assert llm.engine.kv.prefix_hits > 0
    llm.engine.kv.allocator.check_all_free()


def test_n_samples_with_cached_prompt(tiny_llama_dir):
    prompt = list(range(200, 250))
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    off = LLM(tiny_llama_dir, show_progress=False, enable_prefix_caching=False)
    on = LLM(tiny_llama_dir, show_progress=False, enable_prefix_caching=True)
    expected = _tokens(off.generate([prompt], params))
    assert _tokens(on.generate([prompt], params)) == expected
    hits = on.engine.kv.prefix_hits
    assert _tokens(on.generate([prompt], params)) == expected  # now from the cache
    assert on.engine.kv.prefix_hits - hits == 48
    on.engine.kv.allocator.check_all_free()


def test_eviction_under_a_small_pool_keeps_outputs_and_leaks_nothing(tiny_llama_dir, reference):

    probe = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=1, kv_cache_memory=1 << 20)
    block = probe.engine.runner.layout.bytes_per_block  # the default block size, 16
    llm = LLM(tiny_llama_dir, show_progress=False, enable_prefix_caching=True,
              kv_cache_memory=8 * block)  # 8 blocks: every workload evicts earlier ones
    allocator = llm.engine.kv.allocator
    real_allocate = allocator.allocate

    def allocate_checked():
        block_id = real_allocate()
        holders = [s for s in llm.engine.scheduler.running if block_id in s.block_table]
        assert not holders, "evicted a block that a running sequence holds"
        return block_id

    allocator.allocate = allocate_checked
    for name, prompts in _workloads().items():
        assert _tokens(llm.generate(prompts, _greedy())) == reference[name], name
        allocator.check_all_free()
    assert allocator.num_evictable > 0


def test_long_prompt_does_not_stall_running_decodes(tiny_llama_dir):
    budget = 24
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_batched_tokens=budget,
              max_num_seqs=16)
    engine = llm.engine
    streams = [f"s{i}" for i in range(8)]
    for i, request_id in enumerate(streams):
        engine.add_request(request_id, [300 + i, 301, 302], _greedy(60))
    while any(engine.scheduler.waiting) or any(
            s.num_uncomputed_tokens > 1 for s in engine.scheduler.running):
        engine.step()
    engine.add_request("long", list(range(1000, 1800)), _greedy(4))
    steps_with_prefill = 0
    while engine.has_unfinished_requests():
        live = {s.request_id for s in engine.scheduler.running if s.request_id in streams}
        engine.step()
        plan = engine.last_plan
        decoding = {s.request_id for s, n in plan.scheduled if n == 1}
        chunk = sum(n for s, n in plan.scheduled if s.request_id == "long" and n > 1)
        assert live <= decoding  # every running stream gets its token in every step
        assert plan.num_tokens <= budget
        steps_with_prefill += chunk > 0
    assert steps_with_prefill >= 800 // budget
    engine.kv.allocator.check_all_free()


def test_outputs_count_the_prompt_tokens_found_cached(tiny_llama_dir):
    """num_cached_tokens: the prompt's leading full blocks the cache held at admission (never
    the whole prompt: its last token is computed for the first logits)."""
    prompt = list(range(5, 45))
    shares_two_blocks = prompt[:16] + list(range(300, 320))
    llm = LLM(tiny_llama_dir, show_progress=False, block_size=8)
    try:
        first, again, partial = (llm.generate([p], _greedy(2))[0]
                                 for p in (prompt, prompt, shares_two_blocks))
        assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 32)
        assert partial.num_cached_tokens == 16
        assert again.outputs[0].token_ids == first.outputs[0].token_ids
    finally:
        llm.shutdown()


@pytest.mark.parametrize("offloading", [0.0, 0.01], ids=["device", "with-host-tier"])
def test_reset_prefix_cache_forgets_every_prefix_only_when_idle(tiny_llama_dir, offloading):
    """vLLM's LLM.reset_prefix_cache: a prompt seen before is computed again after it (on the
    device and in the host tier); while a request runs it changes nothing and says so."""
    prompt = list(range(5, 45))
    llm = LLM(tiny_llama_dir, show_progress=False, block_size=8,
              kv_offloading_size=offloading)
    try:
        first = llm.generate([prompt], _greedy(2))[0]
        assert llm.generate([prompt], _greedy(2))[0].num_cached_tokens == 32
        llm.engine.add_request("running", prompt, _greedy(4))
        llm.engine.step()
        assert llm.reset_prefix_cache() is False
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
        assert llm.reset_prefix_cache() is True
        assert llm.engine.kv.allocator.num_cached == 0
        again = llm.generate([prompt], _greedy(2))[0]
        assert again.num_cached_tokens == 0
        assert again.outputs[0].token_ids == first.outputs[0].token_ids
        llm.engine.kv.allocator.check_all_free()
    finally:
        llm.shutdown()
