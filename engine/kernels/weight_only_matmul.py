"""A few rows of activations times 8-bit weights, read as they are stored.

At decode batch sizes a linear layer is a matrix-vector product: its time is the weights'
bytes over the memory bandwidth. `torch._scaled_mm` (fp8 x fp8) first quantizes the
activations, then runs a tile shape made for many rows, which at one row leaves most of the
GPU idle. Here each program reads BLOCK_N output channels' weights once, converts them to the
activations' dtype, and multiplies by every row at once; the channel scales apply to the
float32 sums. The weights may be any dtype (fp8 e4m3 on GPUs that have it; the CPU
interpreter's tests use float16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # rows a program multiplies at once (tl.dot's smallest); more rows, more programs
BLOCK_N = 16  # output channels per program: at 4,096 outputs, 256 programs
BLOCK_K = 256


@triton.jit
def _weight_only_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, rows, outputs, inner,
    stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row_block = tl.program_id(1)
    m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < rows
    n_ok = n < outputs
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, inner, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_ok = k < inner
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.dot(x, w.to(x.dtype))
    scale = tl.load(scale_ptr + n, mask=n_ok, other=0.0)
    out = acc * scale[None, :]
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :], out.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def weight_only_matmul(x: torch.Tensor, weight: torch.Tensor,
                       scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] * scale [N] float32)^T -> [M, N] in x's dtype."""
    rows, inner = x.shape
    outputs = weight.shape[0]
    out = torch.empty(rows, outputs, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    assert weight.stride(1) == 1 and weight.shape[1] == inner
    grid = (triton.cdiv(outputs, BLOCK_N), triton.cdiv(rows, BLOCK_M))
    _weight_only_kernel[grid](
        x, weight, scale, out, rows, outputs, inner,
        x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return out
