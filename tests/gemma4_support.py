"""A small Gemma 4 text model's config, for the engine's tests and the Triton kernels'."""

from __future__ import annotations

from typing import Any

LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def gemma4_config(vocab: int, **changes: Any) -> Any:
    """Sliding layers of 2 KV heads of 16 over a window of 6; full layers of 1 KV head of 32
    (values from the keys), a quarter of it turned; logits soft-capped."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                   attention_k_eq_v=True, layer_types=LAYERS, sliding_window=6,
                   hidden_size_per_layer_input=0, final_logit_softcapping=30.0,
                   max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Gemma4TextConfig(**options)
