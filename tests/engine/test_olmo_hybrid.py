"""AI2's OLMo Hybrid (`OlmoHybridForCausalLM`): gated delta nets (Qwen3.5's rule, each of q,
k, v, the gate, b and a its own projection and q, k and v their own convolution, write
strengths up to 2) under Llama's pre-norms
in most layers, OLMo 3's attention layers (a norm after each branch, q and k normalized over
the whole projection) among them, rotary only where the config gives rope_theta. Greedy output
and log-probabilities equal transformers batched, chunked, with state slots reused and forked,
over two tensor-parallel ranks and resumed from the prefix cache's checkpoints."""

from __future__ import annotations

import pytest
from hybrid_support import ENGINE, MAX_NEW, check_equals_transformers, greedy
from model_support import (
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
)

from tokenmill.engine import LLM

LAYERS = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]


def olmo_hybrid_config(vocab: int, **changes):
    """Gated delta nets of 2 key heads of 16 serving 4 value heads of 8, one attention layer
    of 4 heads (2 KV) of 16 with rotary embeddings. (q, k and v equally wide: transformers
    saves the three convolutions as three equal parts of the one it loads.)"""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   layer_types=LAYERS, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                   linear_allow_neg_eigval=True, max_position_embeddings=512,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.OlmoHybridConfig(**options)


@pytest.mark.parametrize("kind", ["rope", "nope", "positive_writes"])
def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts, kind):
    """With rotary embeddings, without (no rope_theta), and with write strengths in [0, 1]
    (linear_allow_neg_eigval false)."""
    changes = {"nope": dict(rope_parameters={"rope_type": "default"}),
               "positive_writes": dict(linear_allow_neg_eigval=False)}.get(kind, {})
    directory = make_random_model(str(tmp_path), olmo_hybrid_config(
        len(vocab_tokenizer), **changes), vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=1)


def test_tensor_parallel_and_prefix_cached_equal_transformers(tmp_path, vocab_tokenizer,
                                                              prompts):
    """Two ranks: one key head each with its two value heads (their rows of q, k, v, the
    gate, b and a) and half the attention heads; then the prompts again from checkpoints."""
    directory = make_random_model(str(tmp_path), olmo_hybrid_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert llm.engine.runner.model.model.layers[0].linear_attn.shape.num_v_heads == 2
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        hits = llm.engine.kv.prefix_hits
        assert [out[0] for out in greedy(llm, prompts)] == expected
        assert llm.engine.kv.prefix_hits > hits
