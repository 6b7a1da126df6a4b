"""RMSNorm with the decoder's residual add fused in, in Hugging Face's op order (Llama's, or
Gemma's, which scales by 1 + weight in float32 before rounding); and LayerNorms with the same
calling convention: Cohere's (mean-centred in float32, a weight and no bias), torch's (a
weight and a bias: StarCoder 2) and OLMo's (neither).

`rms_norm` is the torch reference and the CPU path; on the Triton backend one kernel
(`kernels/rms_norm.py`) does the add and the norm. The kernel module imports triton, so it is
imported on first use only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, backend: str = "torch",
             unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, residual stream) of x, or of x + residual when a residual is given.

    The sum is rounded to x's dtype (it is the residual stream, as the reference models'
    `x = x + attn_out`); the norm runs in float32, is cast to the input dtype, then multiplied
    by the weight (LlamaRMSNorm). With `unit_offset` (GemmaRMSNorm) it is multiplied by
    1 + weight in float32 and then cast. The Triton kernel overwrites `residual` with the sum.
    """
    if backend == "triton":
        return _kernel()(x, weight, eps, residual, unit_offset)
    if residual is not None:
        x = x + residual
    if unit_offset:
        scale = 1.0 + weight.float()
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), scale, eps), x
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True).add_(eps)) * scale).to(x.dtype), x
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # One fused op, bit for bit the same float32 arithmetic as the steps below (tested).
        return F.rms_norm(x, (x.shape[-1],), weight, eps), x
    # .float() and .to() dispatch an op even when the dtype already matches: skip them then.
    h = x if x.dtype == torch.float32 else x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True).add_(eps))
    if h.dtype != x.dtype:
        h = h.to(x.dtype)
    return weight * h, x


class UnweightedRMSNorm(nn.Module):
    """RMSNorm without a weight (NanoChat's, transformers' Llama4TextL2Norm). Called as
    RMSNorm is: the residual stream's add comes first. Torch ops on every backend."""

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return self.normalize(x), x

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return unit_rms_norm(x, self.eps)


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight, in float32 with a power of -1/2 as transformers' Gemma 4
    computes it, rounded back (its values and its router's input)."""
    h = x.float()
    return (h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)).to(x.dtype)


@functools.cache
def _kernel() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    from tokenmill.engine.kernels.rms_norm import rms_norm as kernel

    return kernel


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, unit_offset: bool = False):
        """unit_offset: Gemma's norm, which scales by 1 + weight."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.weight, self.eps, residual, backend, self.unit_offset)


class CohereLayerNorm(nn.Module):
    """Cohere's LayerNorm: the mean subtracted and the variance divided out in float32, the
    weight applied in float32, then rounded to the input dtype (CohereLayerNorm). Called as
    RMSNorm is: the residual stream's add comes first. Torch ops on every backend. `size` a
    pair (heads, head size): Command R+'s q/k norms, a weight per head."""

    def __init__(self, size: int | tuple[int, int], eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        h = x.float()
        centred = h - h.mean(-1, keepdim=True)
        h = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype), x


class LayerNorm(nn.Module):
    """torch's LayerNorm (nn.LayerNorm: a weight and a bias, in the input dtype), called as
    RMSNorm is: the residual stream's add comes first. `unit_offset`: the weight is stored as
    an offset from 1 (Nemotron's LayerNorm1P); `bias`: whether it has one (MPT's may not)."""

    def __init__(self, size: int, eps: float, unit_offset: bool = False, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size)) if bias else None
        self.eps, self.unit_offset = eps, unit_offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        weight = self.weight + 1.0 if self.unit_offset else self.weight
        return F.layer_norm(x, (x.shape[-1],), weight, self.bias, self.eps), x


class HeadLayerNorms(nn.Module):
    """A LayerNorm without a bias for each head (StableLM 2 12B's q and k norms, `norms.{h}`):
    every head's is held, under its checkpoint index, and this rank's `count` heads from
    `first` are normalized, each by its own weight. Called as RMSNorm is, on [T, count, D]."""

    def __init__(self, heads: int, first: int, count: int, size: int, eps: float):
        super().__init__()
        self.norms = nn.ModuleList(LayerNorm(size, eps, bias=False) for _ in range(heads))
        self.first, self.count, self.eps = first, count, eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
        weight = torch.stack([norm.weight for norm in
                              self.norms[self.first:self.first + self.count]])
        return F.layer_norm(x, (x.shape[-1],), None, None, self.eps) * weight, x


class UnweightedLayerNorm(UnweightedRMSNorm):
    """OLMo's LayerNorm: no weight, no bias, computed in float32 and cast back."""

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), (x.shape[-1],), None, None, self.eps).to(x.dtype)
