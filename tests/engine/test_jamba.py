"""AI21's Jamba (`JambaForCausalLM`: Jamba 1.5 and 1.7 Mini and Large, Jamba Reasoning):
Mamba-1 layers whose dt input, B and C are normalized with weights, a few attention layers
without positional encoding, experts (the top-k of a softmax, not renormalized) in every other
layer and a dense MLP in the rest. Greedy output and log-probabilities equal transformers'
batched, chunked, with state slots reused and forked (n > 1), and over two tensor-parallel
ranks."""

from __future__ import annotations

import pytest
from hybrid_support import check_equals_transformers, check_tensor_parallel_equals_transformers
from jamba_support import jamba_config
from model_support import make_random_model


def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts):
    """With biases on the Mamba layers' projections and none on their convolution (the
    tensor-parallel case has the defaults: the other way round)."""
    directory = make_random_model(str(tmp_path), jamba_config(
        len(vocab_tokenizer), mamba_proj_bias=True, mamba_conv_bias=False),
        vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=1)


@pytest.mark.parametrize("size", [2])
def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, prompts, size):
    directory = make_random_model(str(tmp_path), jamba_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    check_tensor_parallel_equals_transformers(directory, prompts, size, state_heads=128)


def test_lora_on_attention_and_the_dense_mlp_equals_peft(tmp_path, vocab_tokenizer):
    """An adapter on q_proj, v_proj and the dense layers' gate_proj and down_proj equals
    peft's greedy output and differs from the base model's."""
    from lora_support import check_adapter_equals_peft

    directory = make_random_model(str(tmp_path / "model"), jamba_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    check_adapter_equals_peft(directory, str(tmp_path / "adapter"),
                              ["q_proj", "v_proj", "gate_proj", "down_proj"])
