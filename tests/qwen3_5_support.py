"""A small Qwen3.5 text model's config (gated delta nets and gated attention), for the
engine's tests."""

from __future__ import annotations

from typing import Any

LAYERS = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]


def qwen3_5_config(vocab: int, **changes: Any) -> Any:
    """Linear-attention layers of 2 key heads of 8 serving 4 value heads of 16 (a
    convolution of 4 taps), one full-attention layer of 4 heads (2 KV) of 16, a quarter of
    each head turned."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
                   linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                   layer_types=LAYERS, max_position_embeddings=512, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Qwen3_5TextConfig(**options)
