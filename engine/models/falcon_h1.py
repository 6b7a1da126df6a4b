"""Falcon-H1 (TII's FalconH1ForCausalLM): in every layer attention and a Mamba-2 layer read the
same normalized stream side by side, and their outputs, each scaled, join it together; then
Llama's MLP. Its muP multipliers scale the embeddings, the logits, the keys (folded into the
scores' scale by the decoder), both mixers' inputs and outputs, each part of the Mamba-2
layer's projection, and the MLP's gate and output.

The mixers and the MLP are the decoder's own (built there and handed in); this file holds how
Falcon-H1 joins and scales them, and how its Mamba-2 layer differs from Granite 4.0-H's."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.norm import RMSNorm
from tokenmill.engine.layers.state_layer import KVAndState
from tokenmill.engine.models.architecture import rms_norm_eps_of
from tokenmill.engine.models.mamba2_mixer import GroupedGatedNorm, Mamba2Mixer
from tokenmill.engine.models.source import ModelLoadError


class SiluGate(nn.Module):
    """The scan's output times SiLU of its gate, with no norm (Falcon-H1 without
    mamba_rms_norm)."""

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (y.float() * F.silu(gate.float())).to(y.dtype)


class FalconH1Mixer(Mamba2Mixer):
    """Mamba-2 with Falcon-H1's differences: the input times ssm_in_multiplier; each part of
    in_proj's output (z, x, B, C, dt) times its entry of ssm_multipliers; the gated norm
    optional (mamba_rms_norm) and, where kept, normalizing before the gate
    (mamba_norm_before_gate); out_proj's bias is projectors_bias."""

    def __init__(self, config: Any, tp: TPGroup):
        super().__init__(config, tp)
        shape = self.shape
        self.in_multiplier = float(config.ssm_in_multiplier)
        groups = shape.groups * shape.state_size
        widths = (shape.inner, shape.inner, groups, groups, shape.num_heads)
        bounds = [sum(widths[:i]) for i in range(len(widths) + 1)]
        # (first column, last, multiplier) of each part whose multiplier is not 1.
        self.parts = [(bounds[i], bounds[i + 1], float(m))
                      for i, m in enumerate(config.ssm_multipliers) if float(m) != 1.0]
        if getattr(config, "mamba_rms_norm", False):
            self.norm = GroupedGatedNorm(shape.inner, self.whole, rms_norm_eps_of(config), tp,
                                         gate_first=not config.mamba_norm_before_gate)
        else:
            self.norm = SiluGate()
        self.out_proj = nn.Linear(shape.inner, config.hidden_size,
                                  bias=bool(getattr(config, "projectors_bias", False)))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        projected = self.in_proj(x * self.in_multiplier)
        for first, last, multiplier in self.parts:
            projected[:, first:last] *= multiplier
        return projected


class FalconH1Layer(nn.Module):
    """input_layernorm; `mamba` and `self_attn` side by side; post_attention_layernorm (the
    checkpoint's pre_ff_layernorm); `mlp` (the checkpoint's feed_forward)."""

    def __init__(self, config: Any, attention: nn.Module, mamba: FalconH1Mixer,
                 mlp: nn.Module):
        super().__init__()
        if getattr(config, "mlp_bias", False):
            raise ModelLoadError("Falcon-H1 with mlp_bias is not supported")
        eps = rms_norm_eps_of(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.mamba, self.self_attn = mamba, attention
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.mlp = mlp
        self.attention_in = float(config.attention_in_multiplier)
        self.attention_out = float(config.attention_out_multiplier)
        self.ssm_out = float(config.ssm_out_multiplier)
        self.gate_multiplier, down = (float(m) for m in config.mlp_multipliers)
        # The MLP reads its input times the gate's multiplier, which reaches the gate as
        # Falcon-H1 scales it and the up projection's output by the same factor, which the
        # output's scale takes back (its multiplier divided by the gate's).
        self.mlp_out = down / self.gate_multiplier

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: Any,
                cache: KVAndState, meta: AttentionMetadata,
                per_layer_input: None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As DecoderLayer.forward: the MLP's output, not yet in the returned stream."""
        x, residual = self.input_layernorm(x, residual, meta.backend)
        mixed = self.mamba(x, cache.state, meta) * self.ssm_out + \
            self.self_attn(x * self.attention_in, rope, cache.kv, meta) * self.attention_out
        x, residual = self.post_attention_layernorm(mixed, residual, meta.backend)
        return self.mlp(x * self.gate_multiplier, meta.backend) * self.mlp_out, residual
