"""A small Llama 4 text model's config, for the engine's tests and the Triton kernels'."""

from __future__ import annotations

from typing import Any

ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def llama4_config(vocab: int, **changes: Any) -> Any:
    """Two layers in four rotating within chunks of 8 positions, the others scaling queries
    from position 3 on; experts in the odd layers (one of four per token, 48 wide, and a
    shared one), dense MLPs 96 wide in the even ones."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=48,
                   intermediate_size_mlp=96, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, num_local_experts=4,
                   num_experts_per_tok=1, interleave_moe_layer_step=2,
                   no_rope_layer_interval=2, attention_chunk_size=8, floor_scale=4,
                   attn_scale=0.5, max_position_embeddings=512, rope_parameters=ROPE,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Llama4TextConfig(**options)
