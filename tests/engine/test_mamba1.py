"""Mamba (`MambaForCausalLM`: state-spaces' mamba-130m to 2.8b in transformers' layout) and
Falcon Mamba (`FalconMambaForCausalLM`: falcon-mamba-7b, which normalizes dt's input, B and C):
every layer a Mamba-1 block, no attention, a [channels, state_size] state per sequence.
Greedy output and log-probabilities equal transformers' batched, chunked, with state slots
reused and forked (n > 1), and over two tensor-parallel ranks."""

from __future__ import annotations

import pytest
from hybrid_support import check_equals_transformers, check_tensor_parallel_equals_transformers
from mamba1_support import mamba1_config
from model_support import make_random_model


@pytest.mark.parametrize("falcon", [False, True], ids=["mamba", "falcon-mamba"])
def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts, falcon):
    directory = make_random_model(str(tmp_path), mamba1_config(
        len(vocab_tokenizer), falcon, use_bias=falcon), vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=0)


@pytest.mark.parametrize("size", [2])
def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, prompts, size):
    directory = make_random_model(str(tmp_path), mamba1_config(len(vocab_tokenizer), True),
                                  vocab_tokenizer, draw_norms=True)
    check_tensor_parallel_equals_transformers(directory, prompts, size, state_heads=128)


def test_a_split_that_cuts_no_channel_evenly_is_refused(tmp_path, vocab_tokenizer):
    from tokenmill.engine import LLM
    from tokenmill.engine.contract.config import ConfigError

    directory = make_random_model(str(tmp_path), mamba1_config(
        len(vocab_tokenizer), hidden_size=48, expand=3), vocab_tokenizer)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*144 Mamba channels"):
        LLM(directory, tensor_parallel_size=5, show_progress=False, dtype="float32")
