"""The Mamba (Mamba-1) layer of Mamba, Falcon Mamba and Jamba (transformers' MambaMixer,
FalconMambaMixer, JambaMambaMixer): keeps a state per sequence instead of keys and values
(layers/mamba1.py has the scan).

in_proj gives each channel's input and its output gate z; the input goes through a causal
depthwise convolution and SiLU; x_proj turns it into dt's low-rank input and the token's B
and C (Falcon Mamba normalizes the three, without weights), dt_proj into each channel's dt;
the scan's output, gated by SiLU(z), goes through out_proj. Under tensor parallelism each rank
holds a slice of the channels: x_proj's partial sums are added across ranks (every rank needs
the whole dt input, B and C), as are out_proj's. Jamba normalizes dt's input, B and C with
weights."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.contract.model_shape import mamba1_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.mamba1 import selective_prompts, selective_step
from tokenmill.engine.layers.norm import RMSNorm, unit_rms_norm
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.models.gated_delta_net import PromptRuns, convolve, sequence_runs


class Mamba1Mixer(nn.Module):
    """Parameters under transformers' names (in_proj, conv1d, x_proj, dt_proj, A_log, D,
    out_proj): this rank's channels (distributed/sharding.py)."""

    def __init__(self, config: Any, tp: TPGroup):
        super().__init__()
        whole = mamba1_of(config)
        shape = whole.sharded(tp.size)
        self.shape, self.tp = shape, tp
        jamba = config.model_type == "jamba"  # Jamba's fields are named mamba_*
        bias = bool(getattr(config, "mamba_proj_bias" if jamba else "use_bias", False))
        conv_bias = bool(getattr(config, "mamba_conv_bias" if jamba else "use_conv_bias", True))
        channels, states = shape.channels, shape.state_size
        self.in_proj = nn.Linear(config.hidden_size, 2 * channels, bias=bias)
        self.conv1d = nn.Conv1d(channels, channels, shape.conv_kernel, groups=channels,
                                bias=conv_bias)
        self.x_proj = nn.Linear(channels, shape.dt_rank + 2 * states, bias=False)
        self.dt_proj = nn.Linear(shape.dt_rank, channels, bias=True)
        self.A_log = nn.Parameter(torch.zeros(channels, states))
        self.D = nn.Parameter(torch.ones(channels))
        self.out_proj = nn.Linear(channels, config.hidden_size, bias=bias)
        # Falcon Mamba: dt's input, B and C each normalized (RMS, no weight); Jamba: the
        # same with weights.
        self.bcdt_eps = float(config.mixer_rms_eps) \
            if config.model_type == "falcon_mamba" else None
        self.weighted_norms = jamba
        if jamba:
            eps = float(config.rms_norm_eps)
            self.dt_layernorm = RMSNorm(shape.dt_rank, eps)
            self.b_layernorm, self.c_layernorm = RMSNorm(states, eps), RMSNorm(states, eps)

    def forward(self, x: torch.Tensor, states: StateLayer,
                meta: AttentionMetadata) -> torch.Tensor:
        shape, tokens = self.shape, x.shape[0]
        inputs, z = self.in_proj(x).chunk(2, dim=-1)
        runs = sequence_runs(meta)
        conv = self.conv1d
        inputs = convolve(inputs.contiguous(), states, runs, conv.weight[:, 0], conv.bias)
        projected = self.tp.all_reduce(self.x_proj(inputs))
        dt, b, c = projected.split([shape.dt_rank, shape.state_size, shape.state_size], dim=-1)
        if self.bcdt_eps is not None:
            dt, b, c = (unit_rms_norm(t, self.bcdt_eps) for t in (dt, b, c))
        if self.weighted_norms:
            norms = (self.dt_layernorm, self.b_layernorm, self.c_layernorm)
            dt, b, c = (norm(t.contiguous(), None, meta.backend)[0]
                        for norm, t in zip(norms, (dt, b, c), strict=True))
        dt = F.softplus(self.dt_proj(dt).float())
        a = -self.A_log.float().exp()

        def step(rows: torch.Tensor | None, slots: torch.Tensor) -> torch.Tensor:
            def pick(t: torch.Tensor) -> torch.Tensor:
                return t if rows is None else t[rows]

            return selective_step(pick(inputs), pick(dt), a, pick(b), pick(c), self.D,
                                  states.ssm, slots)

        def prompts(p: PromptRuns) -> torch.Tensor:  # dt 0 in padding: no decay, no write
            return selective_prompts(p.padded(inputs), p.padded(dt) * p.mask[..., None], a,
                                     p.padded(b), p.padded(c), self.D, states.ssm, p.slots,
                                     p.lengths, meta.backend)

        y = runs.mix(step, prompts, lambda: torch.empty(
            tokens, shape.channels, device=x.device))
        y = (y * F.silu(z.float())).to(x.dtype)
        return self.tp.all_reduce(self.out_proj(y))
