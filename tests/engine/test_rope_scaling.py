"""Rotary frequency scaling against transformers' own: the inverse frequencies and the factor
on cos/sin of each supported kind (LongRoPE's short and long factors, rotation of part of each
head), and greedy output of a YaRN-scaled model past its original context."""

from __future__ import annotations

import pytest
import torch
import transformers
from model_support import hf_greedy, make_random_model
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.layers.rotary import (
    attention_scaling,
    check_rope,
    inverse_frequencies,
    rope_parameters,
)

HEAD_DIM = 64
SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    {"rope_type": "yarn", "factor": 4.0},  # the original context defaults to the model's
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
     "beta_fast": 16, "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 1.0, "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
     "attention_factor": 1.25},
]


def _config(scaling: dict) -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=256, hidden_size=128, head_dim=HEAD_DIM, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, intermediate_size=64,
        max_position_embeddings=1024, rope_parameters={"rope_theta": 1e6, **scaling})


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_frequencies_and_attention_factor_equal_transformers(scaling):
    config = _config(scaling)
    want_freq, want_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    params = rope_parameters(config)
    assert torch.equal(inverse_frequencies(HEAD_DIM, params), want_freq)
    assert attention_scaling(params) == pytest.approx(want_factor, rel=1e-12)


def _phi3_config(partial: float, **scaling) -> transformers.Phi3Config:
    """Phi-4-mini's rope layout at a small size: LongRoPE stretching a 256-token original
    context to 1024, over `partial` of each 64-wide head."""
    pairs = int(HEAD_DIM * partial) // 2
    rope = {"rope_type": "longrope", "rope_theta": 1e4,
            "short_factor": [1.0 + i / pairs for i in range(pairs)],
            "long_factor": [1.0 + 10 * i / pairs for i in range(pairs)], **scaling}
    return transformers.Phi3Config(
        vocab_size=256, hidden_size=2 * HEAD_DIM, num_attention_heads=2, num_key_value_heads=1,
        num_hidden_layers=1, intermediate_size=64, max_position_embeddings=1024,
        original_max_position_embeddings=256, partial_rotary_factor=partial, rope_scaling=rope)


@pytest.mark.parametrize("partial", [1.0, 0.75])
@pytest.mark.parametrize("scaling", [{}, {"attention_factor": 1.1}, {"factor": 2.0}])
def test_longrope_frequencies_and_attention_factor_equal_transformers(partial, scaling):
    """Up to the original context the short factors, past it the long ones."""
    config = _phi3_config(partial, **scaling)
    params = rope_parameters(config)
    longrope = ROPE_INIT_FUNCTIONS["longrope"]
    short, want_factor = longrope(config, "cpu")
    long, _ = longrope(config, "cpu", seq_len=257)
    assert not torch.equal(short, long)
    assert torch.equal(inverse_frequencies(HEAD_DIM, params, 256), short)
    assert torch.equal(inverse_frequencies(HEAD_DIM, params, 257), long)
    assert attention_scaling(params) == pytest.approx(want_factor, rel=1e-12)


@pytest.mark.parametrize("partial", [0.5, 0.75])
def test_partial_rotary_frequencies_equal_transformers(partial):
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    config = transformers.Phi3Config(hidden_size=2 * HEAD_DIM, num_attention_heads=2,
                                     partial_rotary_factor=partial)
    want, _ = Phi3RotaryEmbedding.compute_default_rope_parameters(config, "cpu")
    assert want.shape == (int(HEAD_DIM * partial) // 2,)
    assert torch.equal(inverse_frequencies(HEAD_DIM, rope_parameters(config)), want)


@pytest.mark.parametrize("partial,short_pairs,match", [
    (0.71, 22, "rotates 45 of 64 head dimensions"),  # an odd count cannot rotate in halves
    (1.5, 32, "rotates 96 of 64"),
    (0.75, 5, "short_factor needs 24 numbers"),
])
def test_rope_settings_that_cannot_work_are_refused_by_name(partial, short_pairs, match):
    params = dict(rope_parameters(_phi3_config(0.75)), partial_rotary_factor=partial,
                  short_factor=[1.0] * short_pairs)
    with pytest.raises(ValueError, match=match):
        check_rope(params, HEAD_DIM)


def test_an_unsupported_kind_is_refused_by_name():
    params = rope_parameters(_config({"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(ValueError, match="'dynamic' is not supported"):
        inverse_frequencies(HEAD_DIM, params)


def test_a_yarn_scaled_model_matches_hf_past_its_original_context(tmp_path, smol_tokenizer):
    """The original context is 32 tokens, stretched four times to 128 (beyond the config's
    max_position_embeddings, as Qwen's model cards leave it): prompts and replies run past
    both, where the interpolated frequencies and the attention factor matter."""
    common = dict(vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False,
                  rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                   "original_max_position_embeddings": 32})
    config = transformers.Qwen3Config(head_dim=32, **common)
    directory = make_random_model(str(tmp_path / "qwen3-yarn"), config, smol_tokenizer)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    llm = LLM(directory, show_progress=False, block_size=8)
    try:
        assert llm.engine.max_model_len == 4 * 32
        prompts = [smol_tokenizer.encode("one two three four five six seven eight nine " * k)
                   for k in (1, 6)]
        assert 32 < len(prompts[1]) < 64 < len(prompts[1]) + 40
        got = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40))
        for prompt, out in zip(prompts, got, strict=True):
            assert out.outputs[0].token_ids == hf_greedy(reference, prompt, 40)
    finally:
        llm.shutdown()
