"""A small LFM2 config, for the engine's tests."""

from __future__ import annotations

from typing import Any

LAYERS = ["conv", "conv", "full_attention", "conv"]


def lfm2_config(vocab: int, **changes: Any) -> Any:
    """Convolution layers of three taps over the 64 channels, one attention layer of 4
    heads (2 KV) of 16; an MLP of 2/3 of intermediate_size rounded up to a multiple of 32."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=144,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   layer_types=list(LAYERS), conv_L_cache=3, block_multiple_of=32,
                   block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
                   max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Lfm2Config(**options)


def lfm2_moe_config(vocab: int, **changes: Any) -> Any:
    """LFM2's layers with a dense MLP in the first and four experts, two per token, chosen
    with a bias, in the others."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96,
                   moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, layer_types=list(LAYERS), conv_L_cache=3,
                   num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                   use_expert_bias=True, routed_scaling_factor=1.5,
                   max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Lfm2MoeConfig(**options)


def lfm3_config(vocab: int, **changes: Any) -> Any:
    """LFM3's layers: convolutions, then a full attention layer (rotary over half of each head,
    the proportional kind) and a sliding one (a window of 6, its own rotary), each head's output
    gated; a norm before and after each branch."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, conv_L_cache=3,
                   sliding_window=6, max_position_embeddings=512, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Lfm3Config(**options)
