"""OLMo 2 and OLMo 3 (`Olmo2ForCausalLM`, `Olmo3ForCausalLM`): no norm before attention or the
MLP, one after each, and q/k normalized over the whole projection, which tensor parallelism
splits across ranks (the mean of squares is summed over them, KV heads shared by several
ranks counted once). OLMo 3 slides three layers in four, each kind with its own rotary base.
OLMoE (`OlmoeForCausalLM`): Llama's norms with OLMo's q/k norms, q, k and v clamped, and a
mixture of experts. EXAONE 4 (`Exaone4ForCausalLM`): OLMo's post-norms with per-head q/k
norms, three sliding layers in four, the full one with no positional encoding.
Greedy output equals transformers token for token, batched, chunked, from the prefix cache
and under tensor parallelism."""

from __future__ import annotations

from typing import Any

import pytest
from model_support import (
    greedy_three_ways,
    hf_greedy,
    hf_logprobs,
    hf_reference,
    make_random_model,
    mixed_prompts,
)

from tokenmill.engine import LLM, SamplingParams

MAX_NEW = 8
WINDOW = 16
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def _config(kind: str, vocab: int):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if kind == "olmo2":
        return transformers.Olmo2Config(**common)
    if kind == "exaone4":  # three sliding layers in four; the full one without rotary
        return transformers.Exaone4Config(sliding_window=WINDOW, sliding_window_pattern=4,
                                          **common)
    if kind == "olmoe":  # four experts, two chosen, not renormalized; q, k, v clamped
        return transformers.OlmoeConfig(**{**common, "intermediate_size": 32}, num_experts=4,
                                        num_experts_per_tok=2, norm_topk_prob=False,
                                        clip_qkv=0.3)
    return transformers.Olmo3Config(sliding_window=WINDOW, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, **common)


@pytest.fixture(scope="module", params=["olmo2", "olmo3", "olmoe", "exaone4"])
def olmo(request, tmp_path_factory, vocab_tokenizer) -> tuple[str, list[list[int]], Any]:
    """The checkpoint (its norms drawn, so each one's weight matters), transformers' greedy
    continuations of the mixed prompts, and its model."""
    directory = make_random_model(str(tmp_path_factory.mktemp(request.param)),
                                  _config(request.param, len(vocab_tokenizer)), vocab_tokenizer,
                                  draw_norms=True)
    model = hf_reference(directory, attn_implementation="eager")
    return (directory, [hf_greedy(model, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)],
            model)


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(olmo, vocab_tokenizer):
    directory, expected, _ = olmo
    prompts = mixed_prompts(vocab_tokenizer)
    assert max(len(p) for p in prompts) > 3 * WINDOW
    with LLM(directory, **ENGINE) as llm:
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_equals_hf(olmo, vocab_tokenizer, tp):
    """2 ranks: one KV head each; 4: each KV head on two ranks. The tokens' log-probabilities
    too, which a norm off by a constant factor moves even where the argmax holds."""
    directory, expected, model = olmo
    if tp == 4 and model.config.model_type != "olmoe":
        pytest.skip("KV heads shared by ranks matter where q and k are normalized over the "
                    "whole projection; OLMoE's four ranks cover it (and its experts' widths)")
    prompts = mixed_prompts(vocab_tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    with LLM(directory, tensor_parallel_size=tp, **ENGINE) as llm:
        outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    assert [o.token_ids for o in outputs] == expected
    for prompt, out in zip(prompts, outputs, strict=True):
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(hf_logprobs(model, prompt, out.token_ids), abs=1e-4)
