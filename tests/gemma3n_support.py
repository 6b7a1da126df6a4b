"""A small Gemma 3n text model's config, for the engine's tests."""

from __future__ import annotations

from typing import Any


def gemma3n_config(vocab: int) -> Any:
    """Six layers, sliding and full in turn, the last two reading earlier layers' keys and
    values; per-layer inputs of 8 from a table half the vocabulary; the first two layers'
    activations cut at the 95th percentile; four AltUp streams, LAuReL of rank 8."""
    import transformers

    return transformers.Gemma3nTextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"] * 3, num_kv_shared_layers=2,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab // 2, laurel_rank=8,
        activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
