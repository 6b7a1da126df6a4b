"""A small Mamba-2 config (`Mamba2ForCausalLM`), for the engine's tests."""

from __future__ import annotations

from typing import Any


def mamba2_config(vocab: int, **changes: Any) -> Any:
    """Three Mamba-2 layers of 16 heads of 8 in 2 groups of B and C (16 wide), and nothing
    else: no attention, no MLP."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, num_heads=16, head_dim=8, n_groups=2,
                   state_size=16, num_hidden_layers=3, conv_kernel=4, chunk_size=16,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    options.update(changes)
    return transformers.Mamba2Config(**options)
