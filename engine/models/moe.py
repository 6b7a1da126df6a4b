"""The sparse (mixture-of-experts) block of Mixtral, Qwen2-MoE, Qwen3-MoE, ... layers.

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
from tokenmill.engine.layers.activation import act_and_mul, clamped_swiglu, ungated_act
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.moe import (
    experts_sum,
    route,
    route_grouped,
    route_sparsemixer,
    route_top_sigmoid,
)
from tokenmill.engine.layers.norm import RMSNorm
from tokenmill.engine.models.architecture import MoeNames, MoeShape


class Router(nn.Module):
    """A projection (with a bias in GPT-OSS) kept out of quantization (it is not an
    nn.Linear). DeepSeek's (and GLM-4.5's) computes in float32, as its checkpoint keeps it;
    V3's holds the correction bias its routing chooses by (`e_score_correction_bias`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 grouped: bool = False, correction: tuple[int, ...] | None = None):
        """`correction`: the correction bias's shape as the checkpoint stores it, None for
        none."""
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.keeps_float32 = grouped  # the loader keeps its weights float32
        self.e_score_correction_bias = nn.Parameter(torch.empty(correction)) if correction \
            else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.keeps_float32:
            return functional.linear(x.float(), self.weight.float())
        return functional.linear(x, self.weight, self.bias)


class Expert(nn.Module):
    """One expert's MLP over this rank's slice of its width (no all-reduce: the block adds
    the experts first and reduces once). GPT-OSS's have biases and a clamped SwiGLU
    (`swiglu`: alpha, limit); Nemotron 3's no gate (names.gate None)."""

    def __init__(self, hidden: int, width: int, names: MoeNames, bias: bool = False,
                 swiglu: tuple[float, float] | None = None, activation: str = "silu"):
        """`activation`: of the gate, one of ACTIVATIONS (Gemma 4's experts: GeLU), or of
        up, one of UNGATED_ACTIVATIONS, without a gate."""
        super().__init__()
        self.gated = names.gate is not None
        if self.gated:
            self.gate_up_proj = MergedLinear(hidden, {names.gate: width, names.up: width},
                                             bias=bias)
        else:
            setattr(self, names.up, nn.Linear(hidden, width, bias=bias))
        self.up_name, self.down_name = names.up, names.down
        setattr(self, names.down, nn.Linear(width, hidden, bias=bias))
        self.swiglu = swiglu
        self.activation = activation

    def forward(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        if not self.gated:
            up = ungated_act(getattr(self, self.up_name)(x), self.activation)
            return getattr(self, self.down_name)(up)
        gate, up = self.gate_up_proj(x)
        mixed = act_and_mul(gate, up, self.activation, backend) if self.swiglu is None else \
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
        grouped = shape.grouped
        setattr(self, names.router, Router(hidden, shape.num_experts, bias=shape.biased,
                                           grouped=grouped is not None or shape.float32_router,
                                           correction=grouped and grouped.correction))
        latent = shape.latent_size
        if latent is not None:  # Nemotron 3 Super: the experts' narrower space
            self.fc1_latent_proj = nn.Linear(hidden, latent, bias=False)
            self.fc2_latent_proj = nn.Linear(latent, hidden, bias=False)
        self.experts = nn.ModuleList(Expert(latent or hidden, shape.width // tp.size, names,
                                            shape.biased, shape.swiglu, shape.activation)
                                     for _ in range(shape.num_experts))
        self.shared_name = names.shared
        if shape.shared_width:
            setattr(self, names.shared, Expert(hidden, shape.shared_width // tp.size, names,
                                               activation=shape.activation))
            if names.shared_gated:
                self.shared_expert_gate = Router(hidden, 1)
        self.post_mlp_layernorm = RMSNorm(hidden, shape.post_norm_eps) \
            if shape.post_norm_eps is not None else None

    def forward(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        router = getattr(self, self.router_name)
        grouped = self.shape.grouped
        if self.shape.scales_inputs:
            weights, ids = route_top_sigmoid(router(x), self.shape.top_k)
        elif self.shape.sparsemixer is not None:
            weights, ids = route_sparsemixer(router(x), self.shape.sparsemixer)
        elif grouped is None:
            weights, ids = route(router(x), self.shape.top_k, self.shape.renormalize)
        else:
            logits = router(x)
            if grouped.logit_softcap is not None:
                logits = torch.tanh(logits / grouped.logit_softcap) * grouped.logit_softcap
            weights, ids = route_grouped(logits, router.e_score_correction_bias,
                                         self.shape.top_k, grouped.groups, grouped.topk_group,
                                         self.shape.renormalize, grouped.routed_scale,
                                         grouped.softmax, grouped.group_top,
                                         grouped.bias_on_logits)
        inputs = x if self.shape.latent_size is None else self.fc1_latent_proj(x)
        out = experts_sum(inputs, weights, ids, len(self.experts),
                          lambda e, rows: self.experts[e](rows, backend),
                          scale_inputs=self.shape.scales_inputs)
        if self.shape.latent_size is not None:
            out = self.fc2_latent_proj(out)
        if self.shape.shared_width:
            shared = getattr(self, self.shared_name)(x, backend)
            if self.shape.names.shared_gated:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
            if self.shape.averages_shared:
                out = out / 2
        out = self.tp.all_reduce(out)
        if self.post_mlp_layernorm is not None:  # of the whole sum: after the ranks' add
            out = self.post_mlp_layernorm(out, backend=backend)[0]
        return out
