"""Prompt-token logprobs (SamplingParams.prompt_logprobs) against Hugging Face's forward pass:
alone, chunked, beside requests that do not ask, after a prefix-cache hit, with n > 1 and
through preemption."""

from __future__ import annotations

import random

import pytest
import torch
from engine_support import tiny_llama_block_bytes

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.core import prompt_logprobs as scoring
from tokenmill.engine.execution import prompt_scores

TOL = 1e-4


@pytest.fixture(scope="module")
def hf_tiny(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(length)]


def _params(k: int | None, max_tokens: int = 3, n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          prompt_logprobs=k, n=n)


def _reference(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, vocab]: row p is log P(token p+1 | tokens 0..p)."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def _check(out, hf, k: int) -> None:
    ids = out.prompt_token_ids
    ref = _reference(hf, ids)
    assert len(out.prompt_logprobs) == len(out.prompt_logprob_ranks) == len(ids)
    assert out.prompt_logprobs[0] is None and out.prompt_logprob_ranks[0] is None
    for p in range(1, len(ids)):
        entry, row, token = out.prompt_logprobs[p], ref[p - 1], ids[p]
        assert abs(entry[token] - row[token].item()) < TOL, p
        # The rank within what float rounding can reorder (a random model's tail is dense).
        rank, value = out.prompt_logprob_ranks[p], row[token]
        assert int((row > value + TOL).sum()) + 1 <= rank <= int((row > value - TOL).sum()) + 1
        values, top = row.topk(k) if k else (row[:0], row[:0].long())
        assert set(entry) == set(top.tolist()) | {token}
        for t, v in zip(top.tolist(), values.tolist(), strict=True):
            assert abs(entry[t] - v) < TOL
        assert list(entry.values()) == sorted(entry.values(), reverse=True)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_prompt_logprobs_equal_the_hf_forward_pass(tiny_llama, hf_tiny, k):
    (out,) = tiny_llama.generate([_prompt(37, seed=k)], _params(k))
    _check(out, hf_tiny, k)
    assert out.outputs[0].logprobs is None  # generated-token logprobs were not asked for


def test_chunked_prefill_scores_every_chunk(tiny_llama_dir, tiny_llama, hf_tiny):
    """A 70-token prompt in 16-token chunks, next to a request that does not ask; nothing
    changes what either generates."""
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_batched_tokens=16, max_num_seqs=4)
    prompts = [_prompt(70, seed=1), _prompt(20, seed=2), _prompt(45, seed=3)]
    params = [_params(4, max_tokens=6), _params(None, max_tokens=6), _params(2, max_tokens=6)]
    outs = llm.generate(prompts, params)
    _check(outs[0], hf_tiny, 4)
    _check(outs[2], hf_tiny, 2)
    assert outs[1].prompt_logprobs is None and outs[1].prompt_logprob_ranks is None
    alone = tiny_llama.generate(prompts, _params(None, max_tokens=6))
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in alone]
    llm.engine.kv.allocator.check_all_free()


def test_a_cached_prefix_is_scored_all_the_same(tiny_llama_dir, hf_tiny):
    llm = LLM(tiny_llama_dir, show_progress=False, block_size=8)
    prompt = _prompt(40, seed=4)
    llm.generate([prompt], _params(None))  # its blocks enter the prefix cache
    hits = llm.engine.kv.prefix_hits
    (out,) = llm.generate([prompt], _params(3))
    _check(out, hf_tiny, 3)
    assert llm.engine.kv.prefix_hits == hits  # computed whole, not started from the cache
    llm.generate([prompt], _params(None))
    assert llm.engine.kv.prefix_hits > hits  # and the cache still serves the others


def test_n_sequences_share_one_scoring_of_the_prompt(tiny_llama, hf_tiny):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=4, prompt_logprobs=2, n=3)
    (out,) = tiny_llama.generate([_prompt(25, seed=5)], params)
    assert len(out.outputs) == 3
    _check(out, hf_tiny, 2)


def test_preemption_scores_nothing_twice(tiny_llama_dir, tiny_llama, hf_tiny, monkeypatch):
    """Preempted sequences, some of them in the middle of their prompt, are recomputed from
    the start; what was scored before is kept, the rest is scored once."""
    prompts = [_prompt(30 + 5 * i, seed=10 + i) for i in range(6)]
    small = LLM(tiny_llama_dir, show_progress=False, block_size=8, max_num_batched_tokens=16,
                max_num_seqs=4, kv_cache_memory=12 * tiny_llama_block_bytes(tiny_llama, 8))
    scheduler = small.engine.scheduler
    preempt = scheduler.preempt
    mid_prompt: list[int] = []

    def watching(seq):
        if scoring.needs_scoring(seq) and len(seq.prompt_logprobs.entries) > 1:
            mid_prompt.append(seq.seq_id)
        preempt(seq)

    monkeypatch.setattr(scheduler, "preempt", watching)
    outs = small.generate(prompts, [_params(2, max_tokens=30) for _ in prompts])
    assert scheduler.num_preemptions > 0 and mid_prompt
    for out in outs:
        _check(out, hf_tiny, 2)
    small.engine.kv.allocator.check_all_free()


def test_one_token_prompt_has_nothing_to_score(tiny_llama):
    (out,) = tiny_llama.generate([[500]], _params(3))
    assert out.prompt_logprobs == [None] and out.prompt_logprob_ranks == [None]


def test_long_prompts_are_projected_a_slice_at_a_time(tiny_llama_dir, hf_tiny, monkeypatch):
    """No [prompt, vocab] logits at once: ROWS_PER_SLICE rows per LM-head call."""
    monkeypatch.setattr(prompt_scores, "ROWS_PER_SLICE", 7)
    llm = LLM(tiny_llama_dir, show_progress=False)
    calls: list[int] = []
    logits = llm.engine.runner.model.logits

    def counting(hidden):
        calls.append(hidden.shape[0])
        return logits(hidden)

    monkeypatch.setattr(llm.engine.runner.model, "logits", counting)
    (out,) = llm.generate([_prompt(30, seed=6)], _params(2, max_tokens=1))
    _check(out, hf_tiny, 2)
    assert calls[:5] == [7, 7, 7, 7, 1]  # 29 rows, then the sampled row
    assert max(calls) <= 7


def test_prompt_logprobs_are_checked():
    """Negative counts are no request; the most one may ask is the engine's --max-logprobs
    (tests/server/test_vllm_serving_options.py)."""
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    assert SamplingParams(prompt_logprobs=21).prompt_logprobs == 21


def test_tensor_parallel_ranks_score_the_same_rows(tmp_path, smol_tokenizer):
    """TP=2 on CPU: every rank projects the same slices (the LM head's gather is a
    collective), and the padded vocabulary shard is cut before the softmax."""
    import transformers
    from model_support import make_random_model
    from transformers import AutoModelForCausalLM

    config = transformers.LlamaConfig(
        vocab_size=len(smol_tokenizer) + 3, hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    directory = make_random_model(str(tmp_path / "tp"), config, smol_tokenizer)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompts = [_prompt(90, seed=20), _prompt(12, seed=21)]
    with LLM(directory, show_progress=False, tensor_parallel_size=2, block_size=8,
             max_num_seqs=4, max_num_batched_tokens=48) as llm:
        outs = llm.generate(prompts, [_params(3), _params(None)])
    _check(outs[0], hf, 3)
    assert outs[1].prompt_logprobs is None
