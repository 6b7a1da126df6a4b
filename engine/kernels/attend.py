"""The inner loop the attention kernels share: a tile of query rows over a range of paged K/V.

Online softmax in base 2 (scores arrive pre-scaled by log2(e)): one pass over the keys keeps a
running max m, denominator and unnormalized output per row. Keys are gathered token by token
through the block table, so tiles need not line up with cache blocks. A quantized cache (int8,
fp8) is dequantized tile by tile with each key position's scale, in float32 and then cast to the
query's dtype, as the torch reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def dot_precision(dtype: torch.dtype) -> str:
    """float32 stays exact (no TF32 rounding), so float32 runs match the torch reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def query_groups(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    """Query heads per K/V head, after checking the layout the attention kernels index by:
    q [tokens, heads, dim] and caches [blocks, block_size, kv_heads, dim], unit-stride dims."""
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[2]
    assert num_heads == group * k_cache.shape[2] and k_cache.stride() == v_cache.stride()
    assert q.stride(-1) == k_cache.stride(-1) == 1
    return group


def scale_args(k_cache: torch.Tensor, k_scale: torch.Tensor | None,
               v_scale: torch.Tensor | None) -> tuple:
    """(k_scale, v_scale, stride over blocks, stride over tokens) for the kernels; an unquantized
    cache passes the cache itself as never-read placeholders."""
    if k_scale is None:
        return k_cache, k_cache, 0, 0
    assert k_scale.stride() == v_scale.stride() and k_scale.stride(-1) == 1
    return k_scale, v_scale, k_scale.stride(0), k_scale.stride(1)


def base2_sinks(sinks: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """Attention sinks (or ALiBi slopes) as the kernels read them: float32 in base 2, as the
    scores are; without them, `placeholder`, never read."""
    return placeholder if sinks is None else sinks.float() * LOG2E


def dim_block(head_dim: int) -> int:
    """Tile width over head_dim: a power of two, and at least the 16 that tl.dot needs."""
    return max(16, triton.next_power_of_2(head_dim))


@triton.jit
def attend_context(
    q, q_pos, q_last, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, table_ptr, kv_head, start,
    end, qk_scale, window, softcap, block_size, stride_cb, stride_ct, stride_ch, stride_sb,
    stride_st, head_dim, chunk, slopes,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, QUANTIZED: tl.constexpr, WINDOWED: tl.constexpr,
    SOFTCAPPED: tl.constexpr, CHUNKED: tl.constexpr, ALIBI: tl.constexpr,
):
    """Rows q [BLOCK_M, BLOCK_D] at positions q_pos attend to keys start..end-1 up to q_last
(q_pos: causally; beyond it for rows that see a whole image both ways).

    WINDOWED: a row sees only its last `window` positions (sliding-window layers), so a tile
    may hold no key some row sees; CHUNKED: likewise, a row sees only the positions of its
    own chunk (Llama 4's chunked attention: from its position // chunk * chunk).
    SOFTCAPPED: scores become softcap * tanh(score / softcap) before the softmax (Gemma 2).
    ALIBI: each row's score of a key `distance` behind it drops by its slope (`slopes`
    [BLOCK_M], in base 2) times the distance (BLOOM).
    Returns (acc, denom, m). Without a window every row must see
    a key in the first tile (m stays finite after it); the callers' ranges guarantee that. An
    empty range returns denom 0 and m -inf.
    """
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        pos_ok = pos < end
        block = tl.load(table_ptr + pos // block_size, mask=pos_ok, other=0)
        kv_off = (block * stride_cb + (pos % block_size) * stride_ct
                  + kv_head * stride_ch)[:, None] + dims[None, :]
        kv_mask = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if QUANTIZED:
            scale_off = block * stride_sb + (pos % block_size) * stride_st + kv_head
            k_scale = tl.load(k_scale_ptr + scale_off, mask=pos_ok, other=0.0)
            v_scale = tl.load(v_scale_ptr + scale_off, mask=pos_ok, other=0.0)
            k = k.to(tl.float32) * k_scale[:, None]
            v = v.to(tl.float32) * v_scale[:, None]
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if SOFTCAPPED:
            # softcap arrives in base 2 (times log2(e)), as the scores do; tanh(x) is
            # 2 sigmoid(2x) - 1.
            scores = softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)
        if ALIBI:
            scores += slopes[:, None] * (pos[None, :] - q_pos[:, None]).to(tl.float32)
        visible = pos_ok[None, :] & (pos[None, :] <= q_last[:, None])
        if WINDOWED:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        if CHUNKED:
            visible = visible & (pos[None, :] >= (q_pos[:, None] // chunk) * chunk)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_use = m_new
        if WINDOWED or CHUNKED:
            # A row that has seen no key yet keeps m = -inf: offset by 0 so exp2 gives 0s.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_use[:, None])
        alpha = tl.exp2(m - m_use)
        denom = denom * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    return acc, denom, m
