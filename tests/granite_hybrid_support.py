"""A small Granite 4.0-H config, for the engine's tests and the Triton kernels'."""

from __future__ import annotations

from typing import Any


def granite_hybrid_config(vocab: int, **changes: Any) -> Any:
    """Three Mamba-2 layers (4 heads of 32 in 2 groups of B and C, 8 wide) and one attention
    layer; four experts, two per token, beside a shared MLP; every multiplier set."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=32,
                   shared_intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                   mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
                   mamba_expand=2, mamba_chunk_size=16,
                   layer_types=["linear_attention", "attention", "linear_attention",
                                "linear_attention"],
                   embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5,
                   logits_scaling=2.0, max_position_embeddings=512, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.GraniteMoeHybridConfig(**options)
