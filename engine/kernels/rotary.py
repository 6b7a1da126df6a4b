"""Rotary embedding of q and k in one launch, in place, with the cos/sin lookup inside.

Half-rotation layout: a head's first half x1 and second half x2 become
(x1 * cos - x2 * sin, x2 * cos + x1 * sin). The math is float32 with Hugging Face's rounding
points (apply_rotary_pos_emb in the model dtype): cos and sin rounded to the dtype, each
product and the sum rounded to it. In float32 those roundings do nothing; in bfloat16 they make
the result equal the torch reference (`layers/rotary.apply_rotary`) bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round(x, dtype: tl.constexpr):
    """x rounded to dtype and back to float32, as a torch op in dtype rounds its result."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rotate_heads(ptr, stride_h, num_heads, half, c, s,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rotate one token's heads ([num_heads, 2 * half] at ptr) in place."""
    dtype = ptr.dtype.element_ty
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (dims < half)
    first = ptr + heads * stride_h + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    out1 = _round(x1 * c, dtype) - _round(x2 * s, dtype)
    out2 = _round(x2 * c, dtype) + _round(x1 * s, dtype)
    tl.store(first, out1.to(dtype), mask=mask)
    tl.store(first + half, out2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
    num_q_heads, num_k_heads, half,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    pos = tl.load(pos_ptr + token)
    dims = tl.arange(0, BLOCK_D)[None, :]
    dtype = q_ptr.dtype.element_ty
    c = _round(tl.load(cos_ptr + pos * stride_cos + dims, mask=dims < half, other=0.0), dtype)
    s = _round(tl.load(sin_ptr + pos * stride_sin + dims, mask=dims < half, other=0.0), dtype)
    _rotate_heads(q_ptr + token * stride_qt, stride_qh, num_q_heads, half, c, s,
                  BLOCK_QH, BLOCK_D)
    _rotate_heads(k_ptr + token * stride_kt, stride_kh, num_k_heads, half, c, s,
                  BLOCK_KH, BLOCK_D)


def rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, heads, dim] and k [T, kv_heads, dim] (kv_heads may be 0) in place and
    return them.

    cos, sin: [max_positions, dim / 2] float32, one column per frequency (any row stride);
    positions: [T]. q and k may be views with any token and head strides (the split of the
    merged qkv projection); their last dimension must be contiguous. One program per token.
    """
    tokens, num_q_heads, dim = q.shape
    assert k.shape[0] == tokens and k.shape[2] == dim and q.dtype == k.dtype
    assert q.stride(-1) == k.stride(-1) == cos.stride(-1) == sin.stride(-1) == 1
    assert cos.shape[-1] * 2 == dim and sin.shape[-1] * 2 == dim
    if tokens == 0:
        return q, k
    half = dim // 2
    _rotary_kernel[(tokens,)](
        q, k, positions, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        num_q_heads, k.shape[1], half,
        BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(max(k.shape[1], 1)),  # no keys: Gemma 4's shared KV
        BLOCK_D=triton.next_power_of_2(half),
        # No fused multiply-adds: the float32 result then equals torch's mul-then-add exactly.
        enable_fp_fusion=False,
    )
    return q, k
