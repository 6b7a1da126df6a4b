"""Gemma 3n's text layers (E2B, E4B): AltUp's streams, LAuReL's low-rank branch and
activations sparse by a Gaussian cut-off.

The residual stream is `altup_num_inputs` streams side by side ([streams, tokens, hidden]).
Each layer predicts every stream from all of them (coefficients from a router over the
active one), runs attention and the MLP on the active stream's prediction (beside LAuReL: a
low-rank projection of the normed input, normed and added), corrects every stream by what
the layer changed, and adds to the other streams its per-layer input (gated by the corrected
active stream). Before the first layer the other streams are projections of the embeddings
scaled to their magnitude; after the last, they are projected back, scaled to the active
stream's magnitude, and averaged with it. Attention is Gemma 4's (q, k and v normed, scale
1, the last layers reading an earlier layer's keys and values). Parameters under
transformers' names.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.layers.activation import ungated_act
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.norm import RMSNorm
from tokenmill.engine.layers.rotary import RopeKernel, RopeRows


def magnitude_matched(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """x scaled so that each row's RMS is target's ([..., 1]); x's RMS floored at 1e-5's
    root."""
    own = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * target / own


class AltUp(nn.Module):
    """Predicts every stream before a layer and corrects them after it, with coefficients a
    router reads off the active stream."""

    def __init__(self, config: Any):
        super().__init__()
        n, hidden = int(config.altup_num_inputs), config.hidden_size
        self.n, self.active = n, int(config.altup_active_idx)
        self.correct_output_scale = nn.Parameter(torch.zeros(hidden))
        self.correction_coefs = nn.Linear(n, n, bias=False)
        self.prediction_coefs = nn.Linear(n, n * n, bias=False)
        self.modality_router = nn.Linear(hidden, n, bias=False)
        self.router_norm = RMSNorm(hidden, float(config.rms_norm_eps))
        self.router_scale = 1.0 / hidden

    def _modalities(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.modality_router(self.router_norm(x)[0] * self.router_scale)
        return torch.tanh(routed.float()).type_as(x)

    def predict(self, streams: torch.Tensor) -> torch.Tensor:
        """[n, T, H] -> each stream predicted as the streams mixed by its coefficients."""
        modalities = self._modalities(streams[self.active])
        coefs = self.prediction_coefs(modalities).reshape(-1, self.n, self.n).transpose(1, 2)
        mixed = torch.matmul(streams.permute(1, 2, 0), coefs).permute(2, 0, 1)
        return (mixed + streams).contiguous().type_as(streams)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """Each stream's prediction moved by the layer's change to the active stream, times
        that stream's coefficient plus one."""
        coefs = self.correction_coefs(self._modalities(activated)) + 1.0  # [T, n]
        innovation = activated - predictions[self.active]
        corrected = innovation[None] * coefs.permute(1, 0)[..., None] + predictions
        return corrected.contiguous().type_as(activated)

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        return (x.type_as(self.correct_output_scale) * self.correct_output_scale).type_as(x)


class Laurel(nn.Module):
    """LAuReL: x plus the norm of a rank-`laurel_rank` projection of x."""

    def __init__(self, config: Any):
        super().__init__()
        hidden, rank = config.hidden_size, int(config.laurel_rank)
        self.linear_left = nn.Linear(hidden, rank, bias=False)
        self.linear_right = nn.Linear(rank, hidden, bias=False)
        self.post_laurel_norm = RMSNorm(hidden, float(config.rms_norm_eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))[0]


def normal_quantile(p: float) -> float:
    """The standard normal's quantile at p, in float32 as torch's Normal.icdf computes it (on
    the host: the model may be built on the meta device)."""
    value = torch.tensor(p, dtype=torch.float32, device="cpu")
    return (torch.erfinv(2 * value - 1) * math.sqrt(2)).item()


class SparseMLP(nn.Module):
    """The gated MLP, its gate's activations cut at mean + std * Phi^-1(sparsity) first
    (ReLU of what passes), where the layer's sparsity is not 0."""

    def __init__(self, config: Any, width: int, sparsity: float):
        super().__init__()
        hidden = config.hidden_size
        self.gate_up_proj = MergedLinear(hidden, {"gate_proj": width, "up_proj": width},
                                         bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.activation = config.hidden_activation
        self.std_multiplier = normal_quantile(sparsity) if sparsity > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x)
        if self.std_multiplier is not None:
            multiplier = torch.tensor(self.std_multiplier, dtype=gate.dtype).item()
            cutoff = gate.mean(-1, keepdim=True) + \
                gate.std(-1, keepdim=True, unbiased=False) * multiplier
            gate = F.relu(gate - cutoff)
        return self.down_proj(ungated_act(gate, self.activation) * up)


class Gemma3nLayer(nn.Module):
    """One layer over the streams; called as a decoder layer is, the streams in place of its
    input and no residual carried."""

    def __init__(self, config: Any, attention: nn.Module, layer: int):
        super().__init__()
        hidden, eps = config.hidden_size, float(config.rms_norm_eps)
        self.self_attn = attention
        widths = config.intermediate_size
        width = widths[layer] if isinstance(widths, (list, tuple)) else widths
        self.mlp = SparseMLP(config, int(width), float(config.activation_sparsity_pattern[layer]))
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_per_layer_input_norm"):
            setattr(self, name, RMSNorm(hidden, eps))
        self.altup = AltUp(config)
        self.laurel = Laurel(config)
        per_layer = int(config.hidden_size_per_layer_input)
        self.per_layer_input_gate = nn.Linear(hidden, per_layer, bias=False)
        self.per_layer_projection = nn.Linear(per_layer, hidden, bias=False)
        self.correct_scale = bool(config.altup_correct_scale)
        self.activation = config.hidden_activation

    def forward(self, streams: torch.Tensor, residual: None,
                rope: RopeRows | RopeKernel | None, kv_cache: KVLayer, meta: AttentionMetadata,
                per_layer_input: torch.Tensor) -> tuple[torch.Tensor, None]:
        backend = meta.backend
        predictions = self.altup.predict(streams)
        active = predictions[self.altup.active]
        normed = self.input_layernorm(active, None, backend)[0]
        laurel = self.laurel(normed)
        attended = self.post_attention_layernorm(self.self_attn(normed, rope, kv_cache, meta),
                                                 None, backend)[0]
        joined = (active + attended + laurel) / math.sqrt(2)
        fed = self.mlp(self.pre_feedforward_layernorm(joined, None, backend)[0])
        activated = joined + self.post_feedforward_layernorm(fed, None, backend)[0]
        corrected = self.altup.correct(predictions, activated)
        first = corrected[self.altup.active]
        if self.correct_scale:
            first = self.altup.scaled(first)
        gated = ungated_act(self.per_layer_input_gate(first), self.activation) * per_layer_input
        added = self.post_per_layer_input_norm(self.per_layer_projection(gated), None,
                                               backend)[0]
        corrected[1:] += added
        return corrected, None


def stream_projections(config: Any) -> nn.ModuleList:
    """altup_projections or altup_unembed_projections: one per stream but the active one."""
    hidden = config.hidden_size
    return nn.ModuleList(nn.Linear(hidden, hidden, bias=False)
                         for _ in range(int(config.altup_num_inputs) - 1))


def expand_streams(projections: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """The embeddings [T, H] as the streams [n, T, H]: the others projected, scaled to the
    embeddings' magnitude."""
    target = torch.mean(x ** 2, dim=-1, keepdim=True) ** 0.5
    return torch.stack([x, *(magnitude_matched(p(x).to(x.dtype), target) for p in projections)])


def collapse_streams(projections: nn.ModuleList, streams: torch.Tensor) -> torch.Tensor:
    """The streams [n, T, H] as one [T, H]: their mean, the others projected back and scaled
    to the first's magnitude."""
    target = torch.mean(streams[0] ** 2, dim=-1, keepdim=True) ** 0.5
    back = [magnitude_matched(p(s).to(streams.dtype), target)
            for p, s in zip(projections, streams[1:], strict=True)]
    return torch.mean(torch.stack([streams[0], *back]), dim=0)
