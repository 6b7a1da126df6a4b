"""NVIDIA's Nemotron-H (`NemotronHForCausalLM`: Nemotron-H, Nemotron Nano 2, Nemotron 3): one
block per layer, a norm and one mixer, as its layer_types list them: Mamba-2 layers (a state
per sequence), attention without positional encoding, MLPs of squared ReLU without a gate,
and experts of the same routed as DeepSeek-V3's (sigmoid scores, a correction bias, groups)
beside a shared one, in an optional narrower space (Nemotron 3 Super's latent). Greedy output
and log-probabilities equal transformers' batched, chunked, with state slots reused and forked
(n > 1); only the attention layers hold keys and values; tensor parallelism and LoRA are
refused."""

from __future__ import annotations

import pytest
from hybrid_support import ENGINE, check_equals_transformers
from model_support import draw_correction_bias, make_random_model, mixed_prompts
from nemotron_h_support import LAYERS, nemotron_h_config

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError


@pytest.fixture(scope="module")
def prompts(vocab_tokenizer) -> list[list[int]]:
    return mixed_prompts(vocab_tokenizer)


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


def test_tensor_parallelism_and_lora_are_refused(tmp_path, vocab_tokenizer):
    directory = make_random_model(str(tmp_path), nemotron_h_config(len(vocab_tokenizer)),
                                  vocab_tokenizer)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*Mamba-2"):
        LLM(directory, tensor_parallel_size=2, **ENGINE)
    with pytest.raises(ConfigError, match="enable_lora.*NemotronHForCausalLM"):
        LLM(directory, enable_lora=True, **ENGINE)
