"""A small Falcon-H1 config, for the engine's tests."""

from __future__ import annotations

from typing import Any


def falcon_h1_config(vocab: int, **changes: Any) -> Any:
    """Three layers, each attention of 4 heads over 2 KV heads beside a Mamba-2 layer of 8
    heads of 8 in 2 groups of B and C (16 wide); every muP multiplier away from 1."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
                   mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
                   max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                   pad_token_id=0, embedding_multiplier=1.5, lm_head_multiplier=0.75,
                   mlp_multipliers=[0.8, 1.25], key_multiplier=0.7,
                   attention_in_multiplier=1.2, attention_out_multiplier=0.9,
                   ssm_multipliers=[0.5, 1.5, 0.75, 1.25, 2.0], ssm_in_multiplier=1.1,
                   ssm_out_multiplier=0.6, rope_parameters={"rope_type": "default",
                                                            "rope_theta": 10000.0})
    options.update(changes)
    return transformers.FalconH1Config(**options)
