"""The gated MLP's activation, act(gate) * up, as Hugging Face's act_fn(gate) * up rounds it:
silu (Llama, Qwen, Mistral) or GeLU with the tanh approximation (Gemma).

The torch ops are the reference and the CPU path; on the Triton backend one kernel
(`kernels/activation.py`) does silu and the product. The kernel module imports triton, so it
is imported on first use only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """gate, up: [T, I], the halves of the merged gate_up projection -> [T, I].

    silu is rounded to the dtype before the product, as in the reference models."""
    if backend == "triton":
        return _kernel()(gate, up)
    return F.silu(gate).mul_(up)


# transformers' names for the activations, as configs spell them (hidden_act, or Gemma's
# hidden_activation).
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
# Activations of an MLP without a gate (up, act, down): Arcee's squared ReLU, StarCoder 2's and
# Phi-2's and GPT-2's GeLU (tanh), GPT-NeoX's exact GeLU, OPT's ReLU, Apertus's xIELU (its
# parameters learned per layer: XIELU).
UNGATED_ACTIVATIONS = ("relu2", "gelu_pytorch_tanh", "gelu_new", "gelu", "relu", "xielu")


def ungated_act(x: torch.Tensor, activation: str) -> torch.Tensor:
    """act(x) for one of UNGATED_ACTIVATIONS."""
    if activation in ("gelu_pytorch_tanh", "gelu_new"):  # gelu_new: the same tanh form
        return F.gelu(x, approximate="tanh")
    if activation == "gelu":
        return F.gelu(x)
    if activation == "relu":
        return F.relu(x)
    if activation != "relu2":
        raise ValueError(f"activation {activation!r} is not one of {UNGATED_ACTIVATIONS}")
    return torch.square(F.relu(x))


class XIELU(nn.Module):
    """Apertus's xIELU, under transformers' names: quadratic above zero, an exponential below,
    both slopes learned per layer (alpha_p, alpha_n through softplus), beta and eps as the
    checkpoint stores them."""

    def __init__(self):
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1))
        self.alpha_n = nn.Parameter(torch.zeros(1))
        self.beta = nn.Parameter(torch.zeros(()))
        self.eps = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.minimum(x, self.eps)) - x) * alpha_n +
                           self.beta * x)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float,
                   limit: float) -> torch.Tensor:
    """GPT-OSS's experts' activation: gate clamped from above and up on both sides at `limit`,
    then (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def act_and_mul(gate: torch.Tensor, up: torch.Tensor, activation: str,
                backend: str = "torch") -> torch.Tensor:
    """act(gate) * up for one of ACTIVATIONS; the GeLU is rounded to the dtype before the
    product, as the reference models do."""
    if activation == "silu":
        return silu_and_mul(gate, up, backend)
    return F.gelu(gate, approximate="tanh").mul_(up)


@functools.cache
def _kernel() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    from tokenmill.engine.kernels.activation import silu_and_mul as kernel

    return kernel
