"""Store a step's new K/V into the paged cache through the slot mapping."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch,
    block_size, num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:  # a padding token: nothing to store
        return
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct + heads * stride_ch
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + dst + dims, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst + dims, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_write(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, dim] into caches [blocks, block_size, kv_heads, dim].

    One program per token; a negative slot skips the token (padding rows of a fixed-size batch).
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == v.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride()
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )
