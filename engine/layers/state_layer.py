"""One linear-attention layer's view of the recurrent-state pool, as its layer reads and
writes it: what a gated delta net keeps per sequence in place of keys and values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.engine.layers.kv_layer import KVLayer


@dataclass(frozen=True)
class StateLayer:
    """conv [slots + 1, channels, taps - 1] in the model's dtype: each sequence's last
    inputs to the causal convolution; ssm [slots + 1, value heads, key_dim, value_dim] in
    float32: its delta-rule state. A sequence names its slot (AttentionMetadata.state_slots);
    the last slot (-1) takes the rows of no sequence (graph padding, a profiled step)."""

    conv: torch.Tensor
    ssm: torch.Tensor


@dataclass(frozen=True)
class KVAndState:
    """The caches of a layer that attends and keeps a state side by side (Falcon-H1's): its
    view of the KV pool and of the recurrent-state pool."""

    kv: KVLayer
    state: StateLayer
