"""Moonshot's Kimi Linear (`KimiLinearForCausalLM`): Kimi Delta Attention (a gated delta
rule whose decay is per key channel, a state per sequence in place of keys and values) in
three layers of four, latent attention without positional encoding in the fourth,
DeepSeek-V3's routing over experts stored as Mixtral's. Greedy output and log-probabilities
equal transformers batched, chunked, with state slots reused and forked (n > 1), from the
prefix cache and over two ranks, and the chunked rule equals the rule token by token."""

from __future__ import annotations

import pytest
import torch
from hybrid_support import (
    ENGINE,
    MAX_NEW,
    check_equals_transformers,
    check_tensor_parallel_equals_transformers,
)
from kimi_linear_support import kimi_linear_config
from model_support import (
    draw_correction_bias,
    greedy_three_ways,
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
)

from tokenmill.engine import LLM
from tokenmill.engine.layers.gated_delta import channel_delta_prompts, delta_step


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory, vocab_tokenizer) -> str:
    directory = make_random_model(str(tmp_path_factory.mktemp("kimi")),
                                  kimi_linear_config(len(vocab_tokenizer)), vocab_tokenizer,
                                  draw_norms=True)
    return draw_correction_bias(directory)


def test_greedy_and_logprobs_equal_transformers(kimi_dir, prompts, vocab_tokenizer):
    """And from the prefix cache: the second run of prompts sharing a prefix resumes from the
    delta layers' state checkpoints (kept as Qwen3.5's are)."""
    check_equals_transformers(kimi_dir, prompts, attention_layers=1)
    shared = mixed_prompts(vocab_tokenizer)
    reference = hf_reference(kimi_dir)
    with LLM(kimi_dir, **ENGINE) as llm:
        runs = greedy_three_ways(llm, shared, MAX_NEW)
        assert llm.engine.kv.checkpoints.num_kept > 0
    expected = [hf_greedy(reference, p, MAX_NEW) for p in shared]
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_the_chunked_rule_equals_the_rule_token_by_token():
    """Two prompt chunks of 70 and 25 tokens padded together (g and beta 0 in the padding),
    from states holding something, against delta_step one token at a time: outputs and final
    states, over more than one chunk of CHANNEL_CHUNK."""
    torch.manual_seed(0)
    heads, key_dim, value_dim, lengths = 3, 8, 5, [70, 25]
    longest = max(lengths)
    q = torch.nn.functional.normalize(torch.randn(2, longest, heads, key_dim), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(2, longest, heads, key_dim), dim=-1)
    v = torch.randn(2, longest, heads, value_dim)
    g = -torch.rand(2, longest, heads, key_dim) * 0.3
    beta = torch.rand(2, longest, heads)
    own = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
    g, beta = g * own[..., None, None], beta * own[..., None]
    start = torch.randn(4, heads, key_dim, value_dim) * 0.5
    chunked_states = start.clone()
    slots = torch.tensor([2, 0])
    got = channel_delta_prompts(q, k, v, g, beta, chunked_states, slots)
    stepped_states = start.clone()
    for i, length in enumerate(lengths):
        slot = slots[i:i + 1]
        for t in range(length):
            want = delta_step(q[i:i + 1, t], k[i:i + 1, t], v[i:i + 1, t], g[i:i + 1, t],
                              beta[i:i + 1, t], stepped_states, slot)
            torch.testing.assert_close(got[i, t], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked_states, stepped_states, atol=1e-5, rtol=1e-5)


def test_tensor_parallel_equals_transformers(kimi_dir, prompts):
    """Two ranks: two delta attention heads each (their rows of every projection, their
    convolutions, decay rates and strengths), half the latent attention's heads."""
    check_tensor_parallel_equals_transformers(kimi_dir, prompts, size=2, state_heads=4)
