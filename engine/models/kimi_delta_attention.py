"""Kimi Linear's token mixer, Kimi Delta Attention (KDA): the gated delta rule with a decay
per key channel instead of one per head (layers/gated_delta.py: `delta_step` with a decay
vector, `channel_delta_prompts`).

The input is projected to queries, keys and values (each through its own causal
convolution and SiLU), a write strength per head (beta, the sigmoid of b_proj), and through
low-rank pairs a decay per channel (-exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)) and an
output gate (g_b(g_a(x))). Queries and keys are L2-normalized per head, the queries scaled by
head_dim ** -0.5; each head's output is RMS-normalized and multiplied by the sigmoid of its
gate before o_proj. Parameters under the checkpoint's names, in the layer's self_attn.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.contract.model_shape import linear_attention_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.gated_delta import l2_normalized
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.models.gated_delta_net import (
    GatedNorm,
    convolve,
    delta_rule,
    sequence_runs,
)

CONVS = ("q_conv1d", "k_conv1d", "v_conv1d")


class KimiDeltaAttention(nn.Module):
    """This rank's heads of a KDA layer; o_proj's partial sums are added across ranks. The
    low-rank halves f_a_proj and g_a_proj are whole on every rank."""

    def __init__(self, config: Any, tp: TPGroup):
        super().__init__()
        shape = linear_attention_of(config).sharded(tp.size)
        self.tp = tp
        self.num_heads, self.head_dim = shape.num_v_heads, shape.value_dim
        width, rank = self.num_heads * self.head_dim, int(config.linear_head_dim)
        parts = {"q_proj": width, "k_proj": width, "v_proj": width, "b_proj": self.num_heads,
                 "f_a_proj": rank, "g_a_proj": rank}
        self.in_proj = MergedLinear(config.hidden_size, parts, bias=False)
        self.widths = list(parts.values())
        for name in CONVS:
            setattr(self, name, nn.Conv1d(width, width, shape.conv_kernel, groups=width,
                                          bias=False))
        self.f_b_proj = nn.Linear(rank, width, bias=False)
        self.g_b_proj = nn.Linear(rank, width, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(width))
        self.A_log = nn.Parameter(torch.zeros(1, 1, self.num_heads, 1))
        self.o_norm = GatedNorm(self.head_dim, float(config.rms_norm_eps), sigmoid=True)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, states: StateLayer,
                meta: AttentionMetadata) -> torch.Tensor:
        tokens, heads, dim = x.shape[0], self.num_heads, self.head_dim
        q, k, v, b, f_a, g_a = self.in_proj.forward_merged(x).split(self.widths, dim=-1)
        runs = sequence_runs(meta)
        weight = torch.cat([getattr(self, name).weight for name in CONVS])[:, 0]
        mixed = convolve(torch.cat([q, k, v], dim=-1), states, runs, weight)
        q, k, v = (t.reshape(tokens, heads, dim) for t in mixed.split(heads * dim, dim=-1))
        q = l2_normalized(q.float()) * dim ** -0.5
        k, v = l2_normalized(k.float()), v.float()
        decay = -self.A_log.float().reshape(heads, 1).exp()
        g = decay * F.softplus(self.f_b_proj(f_a).float().reshape(tokens, heads, dim)
                               + self.dt_bias.float().reshape(heads, dim))
        beta = b.float().sigmoid()
        o = delta_rule(q, k, v, g, beta, states.ssm, runs).to(x.dtype)
        gate = self.g_b_proj(g_a).reshape(tokens, heads, dim)
        o = self.o_norm(o, gate)
        return self.tp.all_reduce(self.o_proj(o.reshape(tokens, -1)))
