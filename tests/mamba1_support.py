"""Small Mamba and Falcon Mamba configs (`MambaForCausalLM`, `FalconMambaForCausalLM`), for the
engine's tests."""

from __future__ import annotations

from typing import Any


def mamba1_config(vocab: int, falcon: bool = False, **changes: Any) -> Any:
    """Three Mamba-1 layers of 128 channels (twice the width), 16 states each, dt from a
    rank-4 projection; Falcon Mamba's normalizes dt's input, B and C."""
    import transformers

    options = dict(vocab_size=vocab, hidden_size=64, state_size=16, num_hidden_layers=3,
                   conv_kernel=4, time_step_rank=4, bos_token_id=1, eos_token_id=2,
                   pad_token_id=0, use_mambapy=False)
    options.update(changes)
    kind = transformers.FalconMambaConfig if falcon else transformers.MambaConfig
    return kind(**options)
