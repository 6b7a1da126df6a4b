"""A few rows of activations times 8-bit weights, read as they are stored.

At decode batch sizes a linear layer is a matrix-vector product: its time is the weights'
bytes over the memory bandwidth. `torch._scaled_mm` (fp8 x fp8) first quantizes the
activations, then runs a tile shape made for many rows, which at one row leaves most of the
GPU idle. Here each program reads BLOCK_N output channels' weights over its share of the inner
dimension once, converts them to the activations' dtype, and multiplies by every row at once;
the channel scales apply to the float32 sums. The weights may be any dtype (fp8 e4m3 on GPUs
that have it; the CPU interpreter's tests use float16); float32 rows multiply exactly (no
TF32), as in the attention kernels.

Reaching the bandwidth takes enough weight loads in flight, which depends on the GPU and the
shape: split_k splits the inner dimension over that many programs (their float32 partial sums
are added in a fixed order, so results do not vary between runs), and `rowwise` multiplies
one row per program on the CUDA cores instead of tensor-core tiles of 16 rows. The settings
come from the GPU's measured launch configs (launch_configs.py), keyed by the weight's shape
and whether one row or several multiply it.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tokenmill.engine.kernels.attend import dot_precision
from tokenmill.engine.kernels.launch_configs import launch_config, weight_key

BLOCK_M = 16  # rows a tile multiplies at once (tl.dot's smallest); more rows, more programs


@triton.jit
def _weight_only_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, rows, outputs, inner, split_len,
    stride_xm, stride_wn, stride_os, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    m_ok = m < rows
    n_ok = n < outputs
    end = tl.minimum((split + 1) * split_len, inner)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(split * split_len, end, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_ok = k < end
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.dot(x, w.to(x.dtype), input_precision=DOT_PRECISION)
    scale = tl.load(scale_ptr + n, mask=n_ok, other=0.0)
    out = acc * scale[None, :]
    tl.store(out_ptr + split * stride_os + m[:, None] * stride_om + n[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _weight_only_row_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, outputs, inner, split_len,
    stride_xm, stride_wn, stride_os, stride_om,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.program_id(1)
    split = tl.program_id(2)
    n_ok = n < outputs
    end = tl.minimum((split + 1) * split_len, inner)
    # Products accumulate elementwise; the one reduction over the inner axis comes last.
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for start in range(split * split_len, end, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_ok = k < end
        x = tl.load(x_ptr + row * stride_xm + k, mask=k_ok, other=0.0)
        w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    scale = tl.load(scale_ptr + n, mask=n_ok, other=0.0)
    out = tl.sum(acc, 1) * scale
    tl.store(out_ptr + split * stride_os + row * stride_om + n,
             out.to(out_ptr.dtype.element_ty), mask=n_ok)


def weight_only_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                       **settings: Any) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] * scale [N] float32)^T -> [M, N] in x's dtype.

    settings (launch_configs.KERNEL_DEFAULTS' names) override the device's measured launch
    config for this shape."""
    rows, inner = x.shape
    outputs = weight.shape[0]
    out = torch.empty(rows, outputs, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    assert weight.stride(1) == 1 and weight.shape[1] == inner
    config = launch_config("weight_only_matmul", weight_key(rows, outputs, inner), x.device,
                           settings)
    block_n, block_k = config["block_n"], config["block_k"]
    # Each split's share is whole tiles long; rounding up may leave fewer splits than asked.
    split_len = triton.cdiv(triton.cdiv(inner, config["split_k"]), block_k) * block_k
    splits = triton.cdiv(inner, split_len)
    target = out if splits == 1 else torch.empty(splits, rows, outputs, dtype=torch.float32,
                                                 device=x.device)
    stride_os = 0 if splits == 1 else target.stride(0)
    launch = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    if config["rowwise"]:
        _weight_only_row_kernel[(triton.cdiv(outputs, block_n), rows, splits)](
            x, weight, scale, target, outputs, inner, split_len,
            x.stride(0), weight.stride(0), stride_os, target.stride(-2),
            BLOCK_N=block_n, BLOCK_K=block_k, **launch,
        )
    else:
        _weight_only_kernel[(triton.cdiv(outputs, block_n), triton.cdiv(rows, BLOCK_M), splits)](
            x, weight, scale, target, rows, outputs, inner, split_len,
            x.stride(0), weight.stride(0), stride_os, target.stride(-2),
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
            DOT_PRECISION=dot_precision(x.dtype), **launch,
        )
    if splits > 1:
        out.copy_(target.sum(dim=0))
    return out
