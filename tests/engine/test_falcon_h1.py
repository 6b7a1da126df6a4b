"""TII's Falcon-H1 (`FalconH1ForCausalLM`): in every layer attention and a Mamba-2 layer side
by side on the same normalized stream, each keeping its cache (keys and values, a state), then
Llama's MLP; muP multipliers on the embeddings, logits, keys, both mixers' inputs and outputs,
each part of the Mamba-2 projection and the MLP. Greedy output and log-probabilities equal
transformers' batched, chunked, with state slots reused and forked (n > 1), with and without
the Mamba-2 layer's gated norm (before or after its gate), and over two and four
tensor-parallel ranks."""

from __future__ import annotations

import pytest
from falcon_h1_support import falcon_h1_config
from hybrid_support import (
    check_equals_transformers,
    check_tensor_parallel_equals_transformers,
)
from model_support import make_random_model

NORMS = {"no-norm": dict(mamba_rms_norm=False),
         "norm-then-gate": dict(mamba_rms_norm=True, mamba_norm_before_gate=True),
         "gate-then-norm": dict(mamba_rms_norm=True, mamba_norm_before_gate=False,
                                projectors_bias=True, mamba_proj_bias=True)}


@pytest.mark.parametrize("norm", NORMS)
def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts, norm):
    directory = make_random_model(str(tmp_path), falcon_h1_config(
        len(vocab_tokenizer), **NORMS[norm]), vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=3)


@pytest.mark.parametrize("size", [2, 4])
def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, prompts, size):
    """Two ranks: four Mamba-2 heads and their whole group each; four: two heads, a group's
    gated norm summed across the two ranks that hold it; attention's KV heads replicated."""
    directory = make_random_model(str(tmp_path), falcon_h1_config(
        len(vocab_tokenizer), **NORMS["gate-then-norm"]), vocab_tokenizer, draw_norms=True)
    check_tensor_parallel_equals_transformers(directory, prompts, size, state_heads=8)


def test_lora_on_attention_and_the_mlp_equals_peft(tmp_path, vocab_tokenizer):
    """An adapter on q_proj, v_proj, gate_proj and down_proj (the MLP's, which Falcon-H1
    scales) equals peft's greedy output and differs from the base model's."""
    from lora_support import check_adapter_equals_peft

    directory = make_random_model(str(tmp_path / "model"), falcon_h1_config(
        len(vocab_tokenizer)), vocab_tokenizer, draw_norms=True)
    check_adapter_equals_peft(directory, str(tmp_path / "adapter"),
                              ["q_proj", "v_proj", "gate_proj", "down_proj"])
