"""Mamba-2 (`Mamba2ForCausalLM`: Mistral's Mamba-Codestral, the mamba2 checkpoints in
transformers' layout): every layer a Mamba-2 block, no attention, so no layer keeps keys and
values, only a state per sequence. Greedy output and log-probabilities equal transformers'
batched, chunked, with state slots reused and forked (n > 1), and over two tensor-parallel
ranks (groups split across ranks are Nemotron-H's tests)."""

from __future__ import annotations

import pytest
from hybrid_support import (
    ENGINE,
    check_equals_transformers,
    check_tensor_parallel_equals_transformers,
)
from mamba2_support import mamba2_config
from model_support import make_random_model

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError


@pytest.mark.parametrize("changes", [{}, dict(use_bias=True, use_conv_bias=False)],
                         ids=["plain", "projection-biases"])
def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts, changes):
    directory = make_random_model(str(tmp_path), mamba2_config(len(vocab_tokenizer), **changes),
                                  vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=0)


@pytest.mark.parametrize("size", [2])
def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, prompts, size):
    directory = make_random_model(str(tmp_path), mamba2_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    check_tensor_parallel_equals_transformers(directory, prompts, size, state_heads=16)


def test_what_an_attention_free_model_cannot_do_is_refused(tmp_path, vocab_tokenizer):
    """No keys and values: no host tier to offload them to; a split that cuts a group of B
    and C across ranks is refused as for Nemotron-H."""
    directory = make_random_model(str(tmp_path), mamba2_config(
        len(vocab_tokenizer), hidden_size=48, num_heads=12, n_groups=3), vocab_tokenizer)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*3 Mamba-2 groups"):
        LLM(directory, tensor_parallel_size=2, **ENGINE)
    with pytest.raises(ConfigError, match="kv_offloading_size.*no keys and values"):
        LLM(directory, kv_offloading_size=1, **ENGINE)
