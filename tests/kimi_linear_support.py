"""A small Kimi Linear config (Kimi Delta Attention beside latent attention, DeepSeek-V3's
routing), for the engine's tests."""

from __future__ import annotations

from typing import Any

LAYERS = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]


def kimi_linear_config(vocab: int, **changes: Any) -> Any:
    """Delta attention of 4 heads of 16 (convolutions of 4 taps) in three layers, latent
    attention (a 32-wide latent, no rotary) in the third; eight experts in 4 groups, the 2
    best eligible, two per token beside a shared one; the first layer dense."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                   kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                   linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
                   moe_intermediate_size=32, num_experts=8, num_experts_per_token=2,
                   num_shared_experts=1, num_expert_group=4, topk_group=2,
                   routed_scaling_factor=2.0, layer_types=LAYERS,
                   mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                   bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    options.update(changes)
    return transformers.KimiLinearConfig(**options)
