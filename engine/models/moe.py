"""The sparse (mixture-of-experts) block of Mixtral, Qwen2-MoE and Qwen3-MoE layers.

Every expert is an MLP of its own linear layers, named as the checkpoint names them
(`mlp.experts.3.gate_proj`, Mixtral's `block_sparse_moe.experts.3.w1`), so weights load, shard
and quantize exactly as a dense MLP's do. The router stays in the model dtype: it is small,
and its choice decides which experts run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.activation import clamped_swiglu, silu_and_mul
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.moe import experts_sum, route
from tokenmill.engine.models.architecture import MoeNames, MoeShape


class Router(nn.Module):
    """A projection (with a bias in GPT-OSS) kept out of quantization (it is not an
    nn.Linear)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional.linear(x, self.weight, self.bias)


class Expert(nn.Module):
    """One expert's MLP over this rank's slice of its width (no all-reduce: the block adds
    the experts first and reduces once). GPT-OSS's have biases and a clamped SwiGLU
    (`swiglu`: alpha, limit)."""

    def __init__(self, hidden: int, width: int, names: MoeNames, bias: bool = False,
                 swiglu: tuple[float, float] | None = None):
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, {names.gate: width, names.up: width},
                                         bias=bias)
        self.down_name = names.down
        setattr(self, names.down, nn.Linear(width, hidden, bias=bias))
        self.swiglu = swiglu

    def forward(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        gate, up = self.gate_up_proj(x)
        mixed = silu_and_mul(gate, up, backend) if self.swiglu is None else \
            clamped_swiglu(gate, up, *self.swiglu)
        return getattr(self, self.down_name)(mixed)


class SparseMoeBlock(nn.Module):
    """Router, experts and (Qwen2-MoE) the gated shared expert; under tensor parallelism
    each rank holds a slice of every expert's width and the partial sums are added once."""

    def __init__(self, hidden: int, shape: MoeShape, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.shape = shape
        names = shape.names
        self.router_name = names.router
        setattr(self, names.router, Router(hidden, shape.num_experts, bias=shape.biased))
        self.experts = nn.ModuleList(Expert(hidden, shape.width // tp.size, names, shape.biased,
                                            shape.swiglu)
                                     for _ in range(shape.num_experts))
        if shape.shared_width:
            self.shared_expert = Expert(hidden, shape.shared_width // tp.size, names)
            self.shared_expert_gate = Router(hidden, 1)

    def forward(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        router = getattr(self, self.router_name)
        weights, ids = route(router(x), self.shape.top_k, self.shape.renormalize)
        out = experts_sum(x, weights, ids, len(self.experts),
                          lambda e, rows: self.experts[e](rows, backend))
        if self.shape.shared_width:
            gate = torch.sigmoid(self.shared_expert_gate(x))
            out = out + gate * self.shared_expert(x, backend)
        return self.tp.all_reduce(out)
