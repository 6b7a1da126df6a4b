"""A small Nemotron-H config, for the engine's tests and the Triton kernels'."""

from __future__ import annotations

from typing import Any

# Mamba-2 layers with experts after them, an attention layer and an MLP among them: every
# kind of block Nemotron-H's layer_types name.
LAYERS = ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"]


def nemotron_h_config(vocab: int, **changes: Any) -> Any:
    """Mamba-2 layers of 8 heads of 8 in 2 groups of B and C (16 wide), attention of 4 heads
    over 2 KV heads; four experts, two per token in two groups (one chosen), beside a shared
    one; squared ReLU everywhere."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, layers_block_type=list(LAYERS),
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, n_groups=2,
                   ssm_state_size=16, conv_kernel=4, chunk_size=16, n_routed_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=32,
                   moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                   routed_scaling_factor=2.5, max_position_embeddings=512, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.NemotronHConfig(**options)
