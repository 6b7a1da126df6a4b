"""Paged prefill/extend attention: variable-length query chunks over their cached prefix.

One launch serves a whole batch: sequence i's new queries (rows query_start_loc[i]:[i+1] of q)
sit at the end of its context of seq_lens[i] tokens, so they attend causally to their own chunk
and to everything cached before it (chunked prefill, prefix-cache hits, and decodes, which are
chunks of one). Each program takes one (tile of query rows, sequence, K/V head); a tile's rows
are (token, query head) pairs of that K/V head's group, so K/V are read once per group.

The grid is laid out over the step's rows, not over (longest chunk x sequences): sequence i's
tiles are numbered from (query_start[i] * group) // BLOCK_M + i on, which leaves each sequence
room for all of its tiles, and a program finds its sequence by binary search over
query_start. A step of many decodes and one long chunk thus launches about its rows / BLOCK_M
programs, where a grid sized by the longest chunk launched that many for every sequence, nearly
all of them returning at once.
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


# num_seqs changes every step: one compiled kernel for every value, not one per class.
@triton.jit(do_not_specialize=["num_seqs"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, out_ptr, block_tables_ptr,
    seq_lens_ptr, query_start_ptr, sinks_ptr, last_ptr, alibi_ptr,
    qk_scale, window, softcap, chunk,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_ct, stride_ch, stride_sb, stride_st,
    stride_bt,
    block_size, group, head_dim, num_seqs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, QUANTIZED: tl.constexpr, WINDOWED: tl.constexpr,
    SOFTCAPPED: tl.constexpr, SINKS: tl.constexpr, LIMITED: tl.constexpr,
    CHUNKED: tl.constexpr, ALIBI: tl.constexpr,
):
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    # The last sequence whose first tile number is at most this program's.
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = (tl.load(query_start_ptr + mid) * group) // BLOCK_M + mid
        below = first <= program
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid - 1)
    seq = lo
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    num_rows = q_len * group
    tile_m = program - ((q_start * group) // BLOCK_M + seq)
    if tile_m * BLOCK_M >= num_rows:  # a spare tile number of its sequence
        return
    prefix = tl.load(seq_lens_ptr + seq) - q_len

    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    token = rows // group
    heads = kv_head * group + rows % group
    row_ok = rows < num_rows
    dim_ok = dims < head_dim
    q_pos = prefix + token
    io_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + (q_start + token)[:, None] * stride_qt + heads[:, None] * stride_qh
                + dims[None, :], mask=io_mask, other=0.0)

    # Keys after the tile's last query are masked for every row: stop there.
    end = prefix + (tl.minimum((tile_m + 1) * BLOCK_M, num_rows) - 1) // group + 1
    q_last = q_pos
    if LIMITED:  # rows that see past themselves (an image's, both ways): to the furthest
        q_last = tl.load(last_ptr + q_start + token, mask=row_ok, other=0)
        end = tl.maximum(end, tl.max(tl.where(row_ok, q_last, 0)) + 1)
    start = 0
    if WINDOWED:  # keys before the tile's first query's window are masked for every row
        start = tl.maximum(prefix + (tile_m * BLOCK_M) // group - window + 1, 0)
    if CHUNKED:  # and those before the chunk of the tile's first query
        start = tl.maximum(start, ((prefix + (tile_m * BLOCK_M) // group) // chunk) * chunk)
    slopes = tl.zeros([BLOCK_M], tl.float32)
    if ALIBI:
        slopes = tl.load(alibi_ptr + heads, mask=row_ok, other=0.0)
    acc, denom, m = attend_context(
        q, q_pos, q_last, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
        block_tables_ptr + seq * stride_bt, kv_head, start, end, qk_scale, window, softcap,
        block_size, stride_cb, stride_ct, stride_ch, stride_sb, stride_st, head_dim, chunk,
        slopes, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION, QUANTIZED, WINDOWED, SOFTCAPPED,
        CHUNKED, ALIBI,
    )
    if SINKS:  # each head's sink logit (base 2) joins the denominator, adding no value
        sink = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0)
        m_all = tl.maximum(m, sink)
        alpha = tl.exp2(m - m_all)
        denom = denom * alpha + tl.exp2(sink - m_all)
        acc = acc * alpha[:, None]
    # Every owned row sees at least its own key, so denom > 0 there; a padding row of the tile
    # may see none under a window, and is not stored.
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(out_ptr + (q_start + token)[:, None] * stride_ot + heads[:, None] * stride_oh
             + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=io_mask)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor,
                      query_start_loc: torch.Tensor, scale: float,
                      k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None,
                      zero_unowned: bool = False, window: int | None = None,
                      softcap: float | None = None,
                      sinks: torch.Tensor | None = None,
                      visible_until: torch.Tensor | None = None,
                      chunk: int | None = None, alibi: torch.Tensor | None = None,
                      **settings: Any) -> torch.Tensor:
    """q: [tokens, heads, dim] of every sequence's new tokens -> attention output, same shape.

    Caches are [blocks, block_size, kv_heads, dim]; the new tokens' K/V must already be in them.
    int8/fp8 caches come with their float32 scales [blocks, block_size, kv_heads].
    The grid follows from the shapes alone (no device sync). zero_unowned: rows
    after the last sequence's are padding, left zero (the kernel writes only owned rows).
    window: each query sees only its last `window` positions; chunk: only those of its own
    chunk of `chunk` positions (Llama 4); softcap: scores pass through
    softcap * tanh(score / softcap); sinks: [heads], a logit per head in every softmax's
    denominator (attention sinks); visible_until: [tokens], the last position each query
    sees (None: its own, causal attention), which an image's rows extend to the image's end;
    alibi: [heads], each head's slope times a key's distance behind the query taken off its
    score (BLOOM).
    settings (launch_configs.KERNEL_DEFAULTS' names) override the device's measured launch
    config for this shape.
    """
    num_tokens, _, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = query_groups(q, k_cache, v_cache)
    out = torch.zeros_like(q) if zero_unowned else torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    config = launch_config("prefill_attention", attention_key(q, k_cache, group), q.device,
                           settings)
    block_m = config["block_m"]
    # Every sequence's tiles fit below the next one's first tile number (module docstring).
    grid = (num_tokens * group // block_m + num_seqs, num_kv_heads)
    k_scales, v_scales, scale_sb, scale_st = scale_args(k_cache, k_scale, v_scale)
    _prefill_kernel[grid](
        q, k_cache, v_cache, k_scales, v_scales, out, block_tables, seq_lens, query_start_loc,
        base2_sinks(sinks, q), seq_lens if visible_until is None else visible_until,
        base2_sinks(alibi, q),
        scale * LOG2E, window or 0, (softcap or 0.0) * LOG2E, chunk or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scale_sb, scale_st,
        block_tables.stride(0),
        k_cache.shape[1], group, head_dim, num_seqs,
        BLOCK_M=block_m, BLOCK_N=config["block_n"], BLOCK_D=dim_block(head_dim),
        DOT_PRECISION=dot_precision(q.dtype), QUANTIZED=k_scale is not None,
        WINDOWED=bool(window), SOFTCAPPED=bool(softcap), SINKS=sinks is not None,
        LIMITED=visible_until is not None, CHUNKED=bool(chunk), ALIBI=alibi is not None,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return out
