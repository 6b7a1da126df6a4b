"""NVIDIA's Nemotron-H (`NemotronHForCausalLM`: Nemotron-H, Nemotron Nano 2, Nemotron 3): one
block per layer, a norm and one mixer, as its layer_types list them: Mamba-2 layers (a state
per sequence), attention without positional encoding, MLPs of squared ReLU without a gate,
and experts of the same routed as DeepSeek-V3's (sigmoid scores, a correction bias, groups)
beside a shared one, in an optional narrower space (Nemotron 3 Super's latent). Greedy output
and log-probabilities equal transformers' batched, chunked, with state slots reused and forked
(n > 1) and over two and four tensor-parallel ranks; only the attention layers hold keys
and values; LoRA is refused."""

from __future__ import annotations

import pytest
from hybrid_support import ENGINE, MAX_NEW, check_equals_transformers
from model_support import (
    draw_correction_bias,
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
)
from nemotron_h_support import LAYERS, nemotron_h_config

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError


@pytest.mark.parametrize("kind", ["experts", "dense", "latent"])
def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts, kind):
    """Nemotron 3's experts (four in two groups, the best group's chosen, by a drawn
    correction bias), Nemotron-H's and Nemotron Nano 2's dense MLPs in their place, and
    Nemotron 3 Super's experts in a latent space half the model's width."""
    changes = {"dense": dict(layers_block_type=[
                   "mlp" if kind == "moe" else kind for kind in LAYERS]),
               "latent": dict(moe_latent_size=32)}.get(kind, {})
    directory = make_random_model(str(tmp_path), nemotron_h_config(
        len(vocab_tokenizer), **changes), vocab_tokenizer, draw_norms=True)
    check_equals_transformers(draw_correction_bias(directory), prompts, attention_layers=1)


@pytest.mark.parametrize("size", [2, 4])
def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, prompts, size):
    """Two ranks: each holds four Mamba-2 heads and their whole group; four: two heads each,
    two ranks to a group, whose norm sums its parts across them. Attention, the MLP, every
    expert and the shared one split too, the latent projections whole on every rank."""
    directory = draw_correction_bias(make_random_model(str(tmp_path), nemotron_h_config(
        len(vocab_tokenizer), moe_latent_size=32), vocab_tokenizer, draw_norms=True))
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=size, **ENGINE) as llm:
        mixer = llm.engine.runner.model.model.layers[0].mixer
        assert (mixer.shape.num_heads, mixer.norm.split) == (8 // size, size == 4)
        assert llm.engine.runner.states.ssm.shape[2] == 8 // size
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_tensor_parallel_sizes_that_split_no_head_and_lora_are_refused(tmp_path,
                                                                       vocab_tokenizer):
    directory = make_random_model(str(tmp_path), nemotron_h_config(
        len(vocab_tokenizer), mamba_num_heads=6, n_groups=3), vocab_tokenizer)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*3 Mamba-2 groups"):
        LLM(directory, tensor_parallel_size=2, **ENGINE)
    with pytest.raises(ConfigError, match="enable_lora.*NemotronHForCausalLM"):
        LLM(directory, enable_lora=True, **ENGINE)
