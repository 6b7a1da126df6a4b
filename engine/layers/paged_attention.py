"""Attention over the paged KV cache, in plain torch: the CPU path and the oracle for kernels.

Cache layout, per layer: [num_blocks, block_size, num_kv_heads, head_dim]. Grouped-query
attention is handled by SDPA's enable_gqa, so K/V heads are never repeated in memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.engine.layers.attention_metadata import AttentionMetadata

DECODE_BUCKET = 16  # decode sequences per padded attention batch


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store the step's new K/V ([tokens, kv_heads, dim]) at their slots."""
    num_kv_heads, head_dim = k.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context.

    q: [tokens, heads, dim] -> [tokens, heads, dim]. Decode rows (one query each) run in padded
    batches of similar context length; prefill and chunked-prefill rows run one at a time.
    """
    out = torch.empty_like(q)
    decode = sorted((i for i, n in enumerate(meta.query_lens_list) if n == 1),
                    key=lambda i: meta.seq_lens_list[i])
    # Sequences of similar length share a padded batch, so padding stays small.
    for start in range(0, len(decode), DECODE_BUCKET):
        bucket = decode[start:start + DECODE_BUCKET]
        rows = meta.query_start_loc[bucket]
        out[rows] = _decode_batch(q[rows], k_cache, v_cache, meta, bucket, scale)
    for i, q_len in enumerate(meta.query_lens_list):
        if q_len > 1:
            start = int(meta.query_start_loc[i])
            out[start:start + q_len] = _prefill_one(
                q[start:start + q_len], k_cache, v_cache, meta, i, scale
            )
    return out


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """[length, kv_heads, dim] of one sequence's context, in token order."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache[block_table[:num_blocks]]
    return blocks.reshape(-1, *cache.shape[2:])[:length]


def _prefill_one(q, k_cache, v_cache, meta, i, scale):
    ctx = meta.seq_lens_list[i]
    q_len = q.shape[0]
    k = _gather(k_cache, meta.block_tables[i], ctx).to(q.dtype)
    v = _gather(v_cache, meta.block_tables[i], ctx).to(q.dtype)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if ctx == q_len:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                           enable_gqa=True)
    else:
        query_pos = torch.arange(ctx - q_len, ctx, device=q.device).unsqueeze(1)
        key_pos = torch.arange(ctx, device=q.device).unsqueeze(0)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=key_pos <= query_pos,
                                           scale=scale, enable_gqa=True)
    return o.transpose(0, 1)


def _decode_batch(q, k_cache, v_cache, meta, seqs, scale):
    """One query per sequence, padded to the longest context; the query heads that share a
    K/V head ride along its query axis, so K/V are read once and never repeated."""
    seq_lens = meta.seq_lens[seqs]
    max_len = max(meta.seq_lens_list[i] for i in seqs)
    block_size = k_cache.shape[1]
    tables = meta.block_tables[seqs][:, : -(-max_len // block_size)]
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    k = k_cache[tables].reshape(batch, -1, num_kv_heads, head_dim)[:, :max_len].to(q.dtype)
    v = v_cache[tables].reshape(batch, -1, num_kv_heads, head_dim)[:, :max_len].to(q.dtype)
    mask = torch.arange(max_len, device=q.device).unsqueeze(0) < seq_lens.unsqueeze(1)
    grouped = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(
        grouped, k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask[:, None, None, :], scale=scale,
    )
    return o.reshape(batch, num_heads, head_dim)
