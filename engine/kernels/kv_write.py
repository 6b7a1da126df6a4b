"""Store a step's new K/V into the paged cache through the slot mapping.

A quantized cache (int8, fp8 e4m3) is written with one float32 scale per (token, K/V head):
scale = amax(|row|) / qmax, value = row / scale, int8 rounding half away from zero. The torch
oracle is `layers/kv_quant.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill.engine.kernels.attend import scale_args


@triton.jit
def _quantize_rows(x, QMAX: tl.constexpr, ROUND: tl.constexpr):
    """x [heads, dim] float32 -> (x / scale in [-QMAX, QMAX], scale [heads]); a zero row gets
    scale 1. ROUND rounds to integers (int8); fp8 leaves rounding to the store's conversion."""
    amax = tl.max(tl.abs(x), 1)
    scale = tl.where(amax > 0, amax / QMAX, 1.0)
    y = x / scale[:, None]
    if ROUND:
        r = tl.floor(tl.abs(y) + 0.5)
        y = tl.where(y < 0, -r, r)
    return tl.minimum(tl.maximum(y, -QMAX), QMAX), scale


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_sb, stride_st,
    block_size, num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANTIZED: tl.constexpr, QMAX: tl.constexpr, ROUND: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:  # a padding token: nothing to store
        return
    head_ids = tl.arange(0, BLOCK_H)
    heads = head_ids[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct + heads * stride_ch
    if QUANTIZED:
        k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask, other=0.0)
        v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask, other=0.0)
        k, k_scale = _quantize_rows(k.to(tl.float32), QMAX, ROUND)
        v, v_scale = _quantize_rows(v.to(tl.float32), QMAX, ROUND)
        scale_dst = (slot // block_size) * stride_sb + (slot % block_size) * stride_st + head_ids
        head_ok = head_ids < num_kv_heads
        tl.store(k_scale_ptr + scale_dst, k_scale, mask=head_ok)
        tl.store(v_scale_ptr + scale_dst, v_scale, mask=head_ok)
    else:
        k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
        v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + dst + dims, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst + dims, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_write(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """k, v: [tokens, kv_heads, dim] into caches [blocks, block_size, kv_heads, dim].

    With scales ([blocks, block_size, kv_heads] float32) the caches are int8 or fp8 and each
    row is quantized. One program per token; a negative slot skips the token (padding rows of a
    fixed-size batch).
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == v.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride()
    quantized = k_scale is not None
    # int8: 127, e4m3: 448, e5m2: 57344 (layers/kv_quant.qmax; kernels import nothing from the
    # layers)
    limit = (torch.finfo(k_cache.dtype) if k_cache.dtype.is_floating_point
             else torch.iinfo(k_cache.dtype)).max
    k_scales, v_scales, scale_sb, scale_st = scale_args(k_cache, k_scale, v_scale)
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, k_scales, v_scales, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scale_sb, scale_st,
        k_cache.shape[1], num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        QUANTIZED=quantized, QMAX=float(limit) if quantized else 0.0,
        ROUND=not k_cache.dtype.is_floating_point,
    )
