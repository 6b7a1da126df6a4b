"""LFM2's convolution layer (transformers' Lfm2ShortConv): the token mixer of most of its
layers, keeping the convolution's last inputs per sequence instead of keys and values.

in_proj gives three rows as wide as the model, B, C and x; B * x goes through a depthwise
causal convolution (no activation), whose output times C goes through out_proj."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.engine.contract.model_shape import short_conv_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.models.gated_delta_net import convolve, sequence_runs


class ShortConvMixer(nn.Module):
    """Parameters under transformers' names (in_proj, conv, out_proj): this rank's channels
    (each part of in_proj split alike, distributed/sharding.py); out_proj's partial sums are
    added across ranks."""

    def __init__(self, config: Any, tp: TPGroup):
        super().__init__()
        shape = short_conv_of(config).sharded(tp.size)
        self.channels, self.tp = shape.channels, tp
        bias = bool(getattr(config, "conv_bias", False))
        self.in_proj = nn.Linear(config.hidden_size, 3 * shape.channels, bias=bias)
        self.conv = nn.Conv1d(shape.channels, shape.channels, shape.conv_kernel,
                              groups=shape.channels, bias=bias)
        self.out_proj = nn.Linear(shape.channels, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, states: StateLayer,
                meta: AttentionMetadata) -> torch.Tensor:
        b, c, h = self.in_proj(x).split(self.channels, dim=-1)
        conv = self.conv
        mixed = convolve(b * h, states, sequence_runs(meta), conv.weight[:, 0], conv.bias,
                         silu=False)
        return self.tp.all_reduce(self.out_proj(c * mixed))
