"""The Mamba-2 layer of Granite 4.0-H, Bamba and Nemotron-H (transformers'
GraniteMoeHybridMambaLayer, NemotronHMamba2Mixer): the token mixer of most of their layers,
keeping a state per sequence instead of keys and values (layers/mamba2.py has the scan).

in_proj gives the output gate z, the heads' inputs with their groups' B and C (one causal
convolution over those three, with a bias), and each head's dt; the scan's output, gated by
SiLU(z) and normalized per group, goes through out_proj. Decoding sequences are computed
together, and so are the step's prompt chunks (padded to the longest)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.contract.model_shape import Mamba2, mamba2_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.mamba2 import grouped_gated_rms_norm, ssm_prompts, ssm_step
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.models.architecture import rms_norm_eps_of
from tokenmill.engine.models.gated_delta_net import PromptRuns, convolve, sequence_runs


class GroupedGatedNorm(nn.Module):
    """This rank's part of the gated norm over each group. Where ranks outnumber groups, a
    group's channels are split across ranks: each adds its part's sum of squares into its
    group's slot of a vector every rank sums (an all-reduce of one float per group and
    token), so the norm divides by the whole group's."""

    def __init__(self, size: int, shape: Mamba2, eps: float, tp: TPGroup,
                 gate_first: bool = True):
        """`shape`: the layer's whole shape; `gate_first`: gated before the norm, else after
        (grouped_gated_rms_norm)."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.tp, self.gate_first = eps, tp, gate_first
        self.groups = shape.sharded(tp.size).groups
        self.split = shape.groups < tp.size
        self.whole_groups, self.group = shape.groups, shape.first_group(tp.rank, tp.size)
        self.group_width = shape.inner // shape.groups

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return grouped_gated_rms_norm(x, gate, self.weight, self.groups, self.eps,
                                      self._group_mean if self.split else None,
                                      self.gate_first)

    def _group_mean(self, sums: torch.Tensor) -> torch.Tensor:
        """[tokens, 1, 1] sums of this rank's part of its group -> the group's mean square."""
        slots = sums.new_zeros(sums.shape[0], self.whole_groups)
        slots[:, self.group] = sums[:, 0, 0]
        slots = self.tp.all_reduce(slots)
        return slots[:, self.group, None, None] / self.group_width


class Mamba2Mixer(nn.Module):
    """Parameters under transformers' names (in_proj, conv1d, dt_bias, A_log, D, norm,
    out_proj): this rank's heads (distributed/sharding.py); out_proj's partial sums are
    added across ranks."""

    def __init__(self, config: Any, tp: TPGroup):
        super().__init__()
        whole = mamba2_of(config)
        shape = whole.sharded(tp.size)
        self.shape, self.whole, self.tp = shape, whole, tp
        nemotron = config.model_type == "nemotron_h"
        # Nemotron-H's and Mamba-2's projections take use_bias, their convolution use_conv_bias.
        own_names = nemotron or config.model_type == "mamba2"
        bias = bool(getattr(config, "use_bias" if own_names else "mamba_proj_bias", False))
        self.in_proj = nn.Linear(config.hidden_size,
                                 shape.inner + shape.conv_channels + shape.num_heads, bias=bias)
        channels = shape.conv_channels
        conv_bias = getattr(config, "use_conv_bias" if own_names else "mamba_conv_bias", True)
        self.conv1d = nn.Conv1d(channels, channels, shape.conv_kernel, groups=channels,
                                bias=bool(conv_bias))
        self.dt_bias = nn.Parameter(torch.ones(shape.num_heads))
        self.A_log = nn.Parameter(torch.zeros(shape.num_heads))
        self.D = nn.Parameter(torch.ones(shape.num_heads))
        self.norm = GroupedGatedNorm(shape.inner, whole, rms_norm_eps_of(config), tp)
        self.out_proj = nn.Linear(shape.inner, config.hidden_size, bias=bias)
        low, high = getattr(config, "time_step_limit", None) or (0.0, float("inf"))
        if nemotron:  # transformers' Nemotron-H floors dt at time_step_min, without a ceiling
            low, high = config.time_step_min, float("inf")
        self.dt_limit = (float(low), float(high))

    def forward(self, x: torch.Tensor, states: StateLayer,
                meta: AttentionMetadata) -> torch.Tensor:
        shape, tokens = self.shape, x.shape[0]
        z, inputs, dt = self.project(x).split(
            [shape.inner, shape.conv_channels, shape.num_heads], dim=-1)
        runs = sequence_runs(meta)
        conv = self.conv1d
        mixed = convolve(inputs, states, runs, conv.weight[:, 0], conv.bias)
        groups = shape.groups * shape.state_size
        heads, b, c = mixed.split([shape.inner, groups, groups], dim=-1)
        heads = heads.reshape(tokens, shape.num_heads, shape.head_dim)
        b = b.reshape(tokens, shape.groups, shape.state_size)
        c = c.reshape(tokens, shape.groups, shape.state_size)
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.dt_limit)
        a = -self.A_log.float().exp()
        def step(rows: torch.Tensor | None, slots: torch.Tensor) -> torch.Tensor:
            def pick(t: torch.Tensor) -> torch.Tensor:
                return t if rows is None else t[rows]

            return ssm_step(pick(heads), pick(dt), a, pick(b), pick(c), self.D, states.ssm,
                            slots)

        def prompts(p: PromptRuns) -> torch.Tensor:  # dt 0 in padding: no decay, no write
            return ssm_prompts(p.padded(heads), p.padded(dt) * p.mask[..., None], a,
                               p.padded(b), p.padded(c), self.D, states.ssm, p.slots)

        y = runs.mix(step, prompts, lambda: torch.empty(
            tokens, shape.num_heads, shape.head_dim, device=x.device))
        y = self.norm(y.reshape(tokens, shape.inner).to(x.dtype), z)
        return self.tp.all_reduce(self.out_proj(y))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """in_proj's output: z, the convolution's inputs, dt (Falcon-H1 scales them)."""
        return self.in_proj(x)
