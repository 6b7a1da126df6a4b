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


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)


def qwen3_5_moe_config(vocab: int, **changes: Any) -> Any:
    """Qwen3.5's layers over four experts, two per token, and a shared expert."""
    import transformers

    base = qwen3_5_config(vocab).to_dict()
    options = {key: base[key] for key in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim",
        "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "layer_types", "max_position_embeddings", "bos_token_id", "eos_token_id",
        "pad_token_id")}
    options.update(MOE, **changes)
    return transformers.Qwen3_5MoeTextConfig(**options)


def qwen3_next_config(vocab: int, **changes: Any) -> Any:
    """Qwen3-Next: the same shapes, its layer 1 a dense MLP (mlp_only_layers)."""
    import transformers

    options = qwen3_5_moe_config(vocab).to_dict()
    options = {key: options[key] for key in options if key in (
        *MOE, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim",
        "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "layer_types", "max_position_embeddings", "bos_token_id", "eos_token_id",
        "pad_token_id")}
    options.update(intermediate_size=96, mlp_only_layers=[1], norm_topk_prob=True, **changes)
    return transformers.Qwen3NextConfig(**options)
