"""A small Jamba config (`JambaForCausalLM`), for the engine's tests."""

from __future__ import annotations

from typing import Any


def jamba_config(vocab: int, **changes: Any) -> Any:
    """Four layers: Mamba-1 (128 channels, 16 states, dt from rank 4), attention of 4 heads
    over 2 KV heads (layer 2), Mamba-1 again; four experts, two per token, in layers 1 and
    3, a dense MLP in 0 and 2."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                   num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
                   attn_layer_period=4, attn_layer_offset=2, mamba_d_state=16, mamba_d_conv=4,
                   mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False,
                   max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                   pad_token_id=0)
    options.update(changes)
    return transformers.JambaConfig(**options)
