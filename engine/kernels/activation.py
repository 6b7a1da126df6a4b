"""The gated MLP's activation in one launch: silu(gate) * up.

Rounded as the torch reference (`layers/activation.silu_and_mul`, Hugging Face's
act_fn(gate) * up) rounds in the model dtype: silu computed in float32 and rounded to the dtype,
then the product computed in float32 and rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # columns per program


@triton.jit
def _silu_and_mul_kernel(
    gate_ptr, up_ptr, out_ptr, stride_g, stride_u, stride_o, width,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out_ptr.dtype.element_ty
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * u).to(dtype), mask=mask)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up: [T, I], the two halves of the merged gate_up projection (views with a row
    stride; contiguous last dimension) -> a new [T, I] tensor."""
    assert gate.shape == up.shape and gate.dim() == 2 and gate.dtype == up.dtype
    assert gate.stride(-1) == up.stride(-1) == 1
    tokens, width = gate.shape
    out = torch.empty(tokens, width, dtype=gate.dtype, device=gate.device)
    if out.numel() == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(width))
    _silu_and_mul_kernel[(tokens, triton.cdiv(width, block))](
        gate, up, out, gate.stride(0), up.stride(0), out.stride(0), width, BLOCK=block,
    )
    return out
