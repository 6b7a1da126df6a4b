"""The gated MLP's activation, silu(gate) * up, as Hugging Face's act_fn(gate) * up rounds it.

The torch ops are the reference and the CPU path; on the Triton backend one kernel
(`kernels/activation.py`) does both. The kernel module imports triton, so it is imported on
first use only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """gate, up: [T, I], the halves of the merged gate_up projection -> [T, I].

    silu is rounded to the dtype before the product, as in the reference models."""
    if backend == "triton":
        return _kernel()(gate, up)
    return F.silu(gate).mul_(up)


@functools.cache
def _kernel() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    from tokenmill.engine.kernels.activation import silu_and_mul as kernel

    return kernel
