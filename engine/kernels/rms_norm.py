"""Residual add and RMSNorm in one launch: each row is read once and written once.

The torch reference is `layers/norm.rms_norm` (Hugging Face's LlamaRMSNorm order): the sum
x + residual is rounded to the input dtype (it is the residual stream), normalized in float32,
cast to the input dtype, then multiplied by the weight; with a unit offset (Gemma's norm) it is
multiplied by 1 + weight in float32 and then cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr,
    stride_x0, stride_x1, stride_r0, stride_r1, stride_o0, stride_o1,
    inner_rows, size, eps,
    HAS_RESIDUAL: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    r0 = row // inner_rows
    r1 = row % inner_rows
    cols = tl.arange(0, BLOCK)
    mask = cols < size
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + r0 * stride_x0 + r1 * stride_x1 + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res = res_ptr + r0 * stride_r0 + r1 * stride_r1 + cols
        r = tl.load(res, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(res, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.math.rsqrt(tl.sum(h * h, 0) / size + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    if UNIT_OFFSET:
        out = h * (1.0 + w.to(tl.float32))
    else:
        out = h.to(dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + r0 * stride_o0 + r1 * stride_o1 + cols,
             out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None,
             unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [rows, size] or [rows, heads, size] (any row strides, contiguous last dim).

    Returns (normalized, residual stream). With a residual, the sum x + residual is written
    over `residual` (the caller's residual stream, consumed here) and returned; without one the
    stream is x itself. One program per row.
    """
    assert x.dim() in (2, 3) and x.stride(-1) == 1 and weight.is_contiguous()
    res = x if residual is None else residual
    assert res.shape == x.shape and res.stride(-1) == 1
    size = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out, res
    inner = x.shape[1] if x.dim() == 3 else 1
    _rms_norm_kernel[(x.shape[0] * inner,)](
        x, res, weight, out, *_row_strides(x), *_row_strides(res), *_row_strides(out),
        inner, size, eps,
        HAS_RESIDUAL=residual is not None, UNIT_OFFSET=unit_offset,
        BLOCK=triton.next_power_of_2(size),
    )
    return out, res


def _row_strides(t: torch.Tensor) -> tuple[int, int]:
    """Strides of the two row dimensions; a 2-D tensor has one, and a single inner row."""
    return (t.stride(0), t.stride(1)) if t.dim() == 3 else (t.stride(0), 0)
