"""Gemma 4's parts of its own: the expert block of 26B-A4B and the per-layer inputs of E2B
and E4B.

The expert block: beside each layer's dense MLP, experts chosen per token from the residual
stream, their sum normalized and added to the MLP's output.

The router normalizes the stream (no weight), scales it by its own `scale` over the square
root of the hidden size, projects it to one logit per expert, and keeps the top_k of the
softmax, renormalized and each times its expert's `per_expert_scale`. The experts read the
stream through pre_feedforward_layernorm_2; transformers keeps them as two stacked tensors
per layer, read here as ordinary experts (fused_weights.py).

The per-layer inputs: a second embedding table gives each token one small vector per layer;
added to a projection of the token's embedding (normalized per layer), each layer gates it by
its stream and adds it back (decoder.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.moe import experts_sum, route
from tokenmill.engine.layers.norm import RMSNorm, unit_rms_norm
from tokenmill.engine.models.architecture import MoeNames
from tokenmill.engine.models.moe import Expert, Router

NAMES = MoeNames("experts", "gate_proj", "up_proj", "down_proj")


class Gemma4Router(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        hidden, experts = config.hidden_size, config.num_experts
        self.proj = Router(hidden, experts)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(experts))
        self.eps, self.top_k, self.root = config.rms_norm_eps, config.top_k_experts, hidden ** -0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [rows, top_k] float32, expert ids [rows, top_k])."""
        h = unit_rms_norm(x, self.eps) * self.scale * self.root
        weights, ids = route(self.proj(h), self.top_k, renormalize=True)
        return weights * self.per_expert_scale[ids], ids


class Gemma4Experts(nn.Module):
    """The router and the experts of one layer, and the norms around them; the checkpoint
    keeps them on the layer itself (router, experts, pre_feedforward_layernorm_2,
    post_feedforward_layernorm_2), read under the layer's `moe` (fused_weights.py)."""

    def __init__(self, config: Any, tp: TPGroup):
        """Under tensor parallelism each rank holds a slice of every expert's width; the
        partial sums are added before the norm after them."""
        super().__init__()
        hidden = config.hidden_size
        self.tp = tp
        self.router = Gemma4Router(config)
        self.experts = nn.ModuleList(
            Expert(hidden, config.moe_intermediate_size // tp.size, NAMES,
                   activation=config.hidden_activation)
            for _ in range(config.num_experts))
        self.pre_feedforward_layernorm_2 = RMSNorm(hidden, config.rms_norm_eps)
        self.post_feedforward_layernorm_2 = RMSNorm(hidden, config.rms_norm_eps)

    def forward(self, stream: torch.Tensor, backend: str) -> torch.Tensor:
        """The experts' normalized sum for each row of the residual stream."""
        weights, ids = self.router(stream)
        x = self.pre_feedforward_layernorm_2(stream, None, backend)[0]
        out = experts_sum(x, weights, ids, len(self.experts),
                          lambda e, rows: self.experts[e](rows, backend))
        return self.post_feedforward_layernorm_2(self.tp.all_reduce(out), None, backend)[0]


def per_layer_input_width(config: Any) -> int:
    """The width of each layer's input embedding (E2B's and E4B's), 0 where there is none."""
    return int(getattr(config, "hidden_size_per_layer_input", 0) or 0)


def per_layer_inputs(model: nn.Module, input_ids: torch.Tensor,
                     embeddings: torch.Tensor) -> torch.Tensor:
    """[tokens, layers, width] of a model holding embed_tokens_per_layer,
    per_layer_model_projection and per_layer_projection_norm; `embeddings` the main ones,
    scaled."""
    table = model.embed_tokens_per_layer
    layers = model.config.num_hidden_layers
    width = table.weight.shape[1] // layers
    # Ids past the table's (Gemma 3n's table may be smaller than the vocabulary) read row 0.
    ids = torch.where(input_ids < table.num_embeddings, input_ids, 0)
    own = table(ids) * torch.tensor(width ** 0.5, dtype=table.weight.dtype).item()
    projected = model.per_layer_model_projection(embeddings) * embeddings.shape[-1] ** -0.5
    projected = model.per_layer_projection_norm(projected.view(-1, layers, width))[0]
    return (projected + own.view(-1, layers, width)) * 2 ** -0.5
