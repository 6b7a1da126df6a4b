"""A Nemotron-H layer: one block, a norm and one mixer, in place of a decoder layer's
attention and MLP. Its layer_types say which mixer: a Mamba-2 layer (a state per sequence),
attention (keys and values, no positional encoding), an MLP or a mixture of experts (neither).

The residual stream is carried beside the hidden states, as DecoderLayer carries it: the
norm adds the previous block's output to the stream, so the decoder's loop and final norm
are the same for both."""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.norm import RMSNorm
from tokenmill.engine.layers.state_layer import StateLayer

ATTENTION, RECURRENT = "full_attention", "linear_attention"


class MixerBlock(nn.Module):
    """`norm`, then `mixer` (under the checkpoint's names: layers.{i}.norm, layers.{i}.mixer)."""

    def __init__(self, kind: str, mixer: nn.Module, size: int, eps: float):
        """`kind`: the layer's entry in layer_types, which says how its mixer is called."""
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(size, eps)
        self.mixer = mixer

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: None,
                cache: KVLayer | StateLayer | None, meta: AttentionMetadata,
                per_layer_input: None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As DecoderLayer.forward: the mixer's output, not yet in the returned stream."""
        x, residual = self.norm(x, residual, meta.backend)
        if self.kind == ATTENTION:
            return self.mixer(x, None, cache, meta), residual
        if self.kind == RECURRENT:
            return self.mixer(x, cache, meta), residual
        return self.mixer(x, meta.backend), residual
