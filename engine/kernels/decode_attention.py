"""Paged decode attention: one new query per sequence, split along the context.

Flash-decoding: each program takes one (sequence, K/V head, context split) and attends with all
the query heads that share that K/V head at once (they ride along the tile's row axis), so K/V
are read from memory once per group. Each split leaves a partial output and its log-sum-exp; a
second kernel merges the splits. Splitting keeps the GPU busy when a few long sequences decode.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tokenmill.engine.kernels.attend import (
    LOG2E,
    attend_context,
    base2_sinks,
    dim_block,
    dot_precision,
    query_groups,
    scale_args,
)
from tokenmill.engine.kernels.launch_configs import attention_key, launch_config

TARGET_PROGRAMS = 256  # enough programs to occupy every SM of a large GPU
MIN_SPLIT_TOKENS = 256  # shorter splits would cost more to merge than they save


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr, seq_lens_ptr,
    part_out_ptr, part_lse_ptr, alibi_ptr,
    qk_scale, window, softcap, chunk,
    stride_qs, stride_qh,
    stride_cb, stride_ct, stride_ch, stride_sb, stride_st,
    stride_bt,
    stride_ps, stride_ph, stride_pk, stride_ls, stride_lh,
    block_size, group, head_dim, split_tokens,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, QUANTIZED: tl.constexpr, WINDOWED: tl.constexpr,
    SOFTCAPPED: tl.constexpr, CHUNKED: tl.constexpr, ALIBI: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_tokens
    end = tl.minimum(start + split_tokens, seq_len)
    if WINDOWED:  # the query sees its last `window` positions: earlier splits end up empty
        start = tl.maximum(start, seq_len - window)
    if CHUNKED:  # the query sees its own chunk's positions only
        start = tl.maximum(start, ((seq_len - 1) // chunk) * chunk)

    rows = tl.arange(0, BLOCK_G)  # query heads of this K/V head's group
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * group + rows
    row_ok = rows < group
    dim_ok = dims < head_dim
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    seq_end = tl.zeros([BLOCK_G], tl.int64) + (seq_len - 1)  # the query's own position
    slopes = tl.zeros([BLOCK_G], tl.float32)
    if ALIBI:
        slopes = tl.load(alibi_ptr + heads, mask=row_ok, other=0.0)
    acc, denom, m = attend_context(
        q, seq_end, seq_end, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
        block_tables_ptr + seq * stride_bt, kv_head, start, end, qk_scale, window, softcap,
        block_size, stride_cb, stride_ct, stride_ch, stride_sb, stride_st, head_dim, chunk,
        slopes, BLOCK_G, BLOCK_N, BLOCK_D, DOT_PRECISION, QUANTIZED, WINDOWED, SOFTCAPPED,
        CHUNKED, ALIBI,
    )

    # An empty split (its sequence is shorter) leaves lse = -inf and weighs nothing in the merge.
    denom = tl.where(denom > 0, denom, 1.0)
    lse = m + tl.log2(denom)
    out = acc / denom[:, None]
    part = part_out_ptr + seq * stride_ps + heads * stride_ph + split * stride_pk
    tl.store(part[:, None] + dims[None, :], out, mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, sinks_ptr,
    stride_ps, stride_ph, stride_pk, stride_ls, stride_lh, stride_os, stride_oh,
    num_splits, head_dim,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < num_splits
    dim_ok = dims < head_dim
    lse = tl.load(part_lse_ptr + seq * stride_ls + head * stride_lh + splits, mask=split_ok,
                  other=float("-inf"))
    if SINKS:  # the head's sink logit (base 2) joins the denominator once, adding no value
        sink = tl.load(sinks_ptr + head)
        top = tl.maximum(tl.max(lse, 0), sink)
        weight = tl.exp2(lse - top)
        total = tl.sum(weight, 0) + tl.exp2(sink - top)
    else:
        weight = tl.exp2(lse - tl.max(lse, 0))
        total = tl.sum(weight, 0)
    base = seq * stride_ps + head * stride_ph + splits * stride_pk
    parts = tl.load(part_out_ptr + base[:, None] + dims[None, :],
                    mask=split_ok[:, None] & dim_ok[None, :], other=0.0)
    out = tl.sum(parts * weight[:, None], 0) / total
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
                     scale: float, num_splits: int | None = None,
                     k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None, window: int | None = None,
                     softcap: float | None = None,
                     sinks: torch.Tensor | None = None, chunk: int | None = None,
                     alibi: torch.Tensor | None = None, **settings: Any) -> torch.Tensor:
    """q: [seqs, heads, dim], one query per sequence, at position seq_lens[i] - 1 -> same shape.

    Caches are [blocks, block_size, kv_heads, dim]; block_tables[i] lists sequence i's blocks.
    int8/fp8 caches come with their float32 scales [blocks, block_size, kv_heads].
    max_seq_len (a host int, so no device sync) sizes the splits; num_splits defaults to enough
    programs to fill a large GPU, with splits of at least MIN_SPLIT_TOKENS tokens.
    window: the query sees only its last `window` positions; chunk: only those of its own
    chunk of `chunk` positions; softcap: scores pass through softcap * tanh(score / softcap);
    sinks: [heads], a logit per head in the softmax's denominator (attention sinks), added
    when the splits merge; alibi: [heads], each head's slope times a key's distance behind
    the query taken off its score. settings
    (launch_configs.KERNEL_DEFAULTS' names) override the device's measured launch config for
    this shape (the split kernel's).
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = query_groups(q, k_cache, v_cache)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    config = launch_config("decode_attention", attention_key(q, k_cache, group), q.device, settings)
    block_n = config["block_n"]
    if num_splits is None:
        wanted = triton.cdiv(TARGET_PROGRAMS, num_seqs * num_kv_heads)
        num_splits = max(1, min(wanted, triton.cdiv(max_seq_len, MIN_SPLIT_TOKENS)))
    # Splits are whole tiles long; rounding up may leave fewer splits than asked for.
    split_tokens = triton.cdiv(triton.cdiv(max_seq_len, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_seq_len, split_tokens)
    part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32,
                           device=q.device)
    part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = dim_block(head_dim)
    k_scales, v_scales, scale_sb, scale_st = scale_args(k_cache, k_scale, v_scale)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, k_scales, v_scales, block_tables, seq_lens, part_out, part_lse,
        base2_sinks(alibi, part_lse),
        scale * LOG2E, window or 0, (softcap or 0.0) * LOG2E, chunk or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scale_sb, scale_st,
        block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        k_cache.shape[1], group, head_dim, split_tokens,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_PRECISION=dot_precision(q.dtype), QUANTIZED=k_scale is not None,
        WINDOWED=bool(window), SOFTCAPPED=bool(softcap), CHUNKED=bool(chunk),
        ALIBI=alibi is not None,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    _merge_splits_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, base2_sinks(sinks, out),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        num_splits, head_dim,
        BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, SINKS=sinks is not None,
    )
    return out
