"""IBM's Granite 4.0-H (`GraniteMoeHybridForCausalLM`): Mamba-2 layers (a state per sequence
in place of keys and values) with an attention layer among them, Granite's multipliers,
experts stored as GraniteMoE's beside a shared MLP (the whole MLP of a model without
experts), rotary embeddings only where position_embedding_type asks. Greedy output and
log-probabilities equal transformers batched, chunked, with state slots reused, forked
(n > 1), through the Triton kernels with decode graphs and over two tensor-parallel ranks."""

from __future__ import annotations

import pytest
import torch
from granite_hybrid_support import granite_hybrid_config
from hybrid_support import ENGINE, MAX_NEW, check_equals_transformers
from model_support import (
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
)

from tokenmill.engine import LLM
from tokenmill.engine.layers.mamba2 import ssm_prompts, ssm_step


@pytest.mark.parametrize("kind", ["experts", "dense", "rope"])
def test_greedy_and_logprobs_equal_transformers(tmp_path, vocab_tokenizer, prompts, kind):
    """With experts beside the shared MLP, without (the shared MLP is the MLP), and with
    rotary embeddings in the attention layer (position_embedding_type "rope")."""
    changes = {"dense": dict(num_local_experts=0),
               "rope": dict(position_embedding_type="rope")}.get(kind, {})
    directory = make_random_model(str(tmp_path), granite_hybrid_config(
        len(vocab_tokenizer), **changes), vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=1)


def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, prompts):
    """Two ranks, two heads each of the Mamba-2 layers' four, in two groups: each rank's
    heads one group's; with one group (Granite 4.0-H's own), both ranks hold its B and C and
    its norm sums their parts."""
    for groups in (2, 1):
        directory = make_random_model(str(tmp_path / str(groups)), granite_hybrid_config(
            len(vocab_tokenizer), mamba_n_groups=groups), vocab_tokenizer, draw_norms=True)
        reference = hf_reference(directory)
        expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
        with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
            assert llm.engine.runner.model.model.layers[0].mamba.norm.split == (groups == 1)
            assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_the_chunked_scan_equals_the_scan_token_by_token():
    """Two prompt chunks of 100 and 40 tokens padded together (dt 0 in the padding), from
    states holding something, against the recurrence one token at a time."""
    torch.manual_seed(0)
    heads, head_dim, groups, size, lengths = 4, 6, 2, 5, [100, 40]
    longest = max(lengths)
    x = torch.randn(2, longest, heads, head_dim)
    dt = torch.rand(2, longest, heads) * 0.5
    b, c = torch.randn(2, longest, groups, size), torch.randn(2, longest, groups, size)
    a, d = -torch.rand(heads) * 2, torch.randn(heads)
    own = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None])[..., None]
    start = torch.randn(3, heads, size, head_dim)
    chunked, slots = start.clone(), torch.tensor([2, 0])
    out = ssm_prompts(x, dt * own, a, b, c, d, chunked, slots)
    for i, length in enumerate(lengths):
        states, slot = start.clone(), slots[i:i + 1]
        steps = torch.cat([ssm_step(x[i, t:t + 1], dt[i, t:t + 1], a, b[i, t:t + 1],
                                    c[i, t:t + 1], d, states, slot) for t in range(length)])
        assert torch.allclose(out[i, :length], steps, atol=1e-4)
        assert torch.allclose(chunked[slot], states[slot], atol=1e-4)
    assert torch.equal(chunked[1], start[1])


def test_bamba_equals_transformers(tmp_path, vocab_tokenizer, prompts):
    """IBM's Bamba: the same Mamba-2 layers, Llama's attention turning half of each head, a
    dense MLP under feed_forward after pre_ff_layernorm, final_layernorm."""
    import transformers

    config = transformers.BambaConfig(
        vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=96,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=4,
        mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=16, attn_layer_indices=[1], max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    directory = make_random_model(str(tmp_path), config, vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=1)
