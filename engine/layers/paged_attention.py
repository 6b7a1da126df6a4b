"""Attention over the paged KV cache, in plain torch: the CPU path and the oracle for kernels.

Cache layout, per layer: [num_blocks, block_size, num_kv_heads, head_dim]; a quantized cache
(int8, fp8) adds float32 scales [num_blocks, block_size, num_kv_heads] and is dequantized as it
is gathered. Grouped-query attention is handled by SDPA's enable_gqa, so K/V heads are never
repeated in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.kv_quant import dequantize, quantize

DECODE_BUCKET = 8  # decode sequences per padded attention batch


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store the step's new K/V ([tokens, kv_heads, dim]) at their slots, quantized with their
    scales when the caches are."""
    num_kv_heads, head_dim = k.shape[-2:]
    if k_scale is None:
        if k.dtype != k_cache.dtype:  # .to() dispatches an op even when the dtype matches
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)
        return
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        values, row_scales = quantize(x, cache.dtype)
        # As bytes: index_copy_ has no float8 kernel on CPU.
        cache.view(torch.uint8).view(-1, num_kv_heads, head_dim).index_copy_(
            0, slot_mapping, values.view(torch.uint8))
        scales.view(-1, num_kv_heads).index_copy_(0, slot_mapping, row_scales)


@dataclass
class DecodeBucket:
    """Decode sequences of similar context length, attended to as one padded batch.

    Built once per step and shared by every layer: which query rows, which blocks (flattened,
    so one index_select gathers them all), and the mask of each sequence's real context.
    """

    rows: torch.Tensor      # [batch] query rows of these sequences
    lengths: torch.Tensor   # [batch] their context lengths
    blocks: torch.Tensor    # [batch * num_blocks] block ids, row-major by sequence
    num_blocks: int
    # [batch, 1, 1, num_blocks * block_size] True where context exists; None for a bucket of
    # one sequence, which attends to exactly its `length` tokens with no mask to apply.
    mask: torch.Tensor | None
    length: int
    # A lone sequence on CPU whose blocks are consecutive in the pool (the allocator hands out
    # fresh blocks in order): the first of them, so its context is read as a view of the cache
    # instead of gathered into a copy at every layer. None otherwise.
    first_block: int | None = None


@dataclass(frozen=True)
class Scores:
    """How a layer turns q.k into attention weights: the scale, the sliding window (each query
    sees its last `window` positions; None: the whole context), Gemma 2's soft cap
    (softcap * tanh(score / softcap) before the softmax; None: none) and Llama 4's chunks
    (each query sees the positions of its own chunk of `chunk`, from position // chunk *
    chunk; None: no chunks)."""

    scale: float
    window: int | None = None
    softcap: float | None = None
    chunk: int | None = None


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float | Scores, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its cached context (the whole of
    it, or a sliding window of it).

    q: [tokens, heads, dim] -> [tokens, heads, dim]. Decode rows (one query each) run in padded
    batches of similar context length; prefill and chunked-prefill rows run one at a time.
    sinks: [heads], a logit per head that joins every softmax's denominator and adds nothing
    to the output (GPT-OSS's attention sinks). alibi: [heads], each head's slope: a key
    `distance` positions behind the query scores slope * -distance more (ALiBi: BLOOM's).
    """
    scores = scale if isinstance(scale, Scores) else Scores(scale)
    cache = KVLayer(k_cache, v_cache, k_scale, v_scale)
    buckets = decode_buckets(meta, k_cache.shape[1])
    if q.shape[0] == 1 and buckets:  # one decoding sequence: its bucket's output is the output
        return _decode_bucket(q, cache, buckets[0], scores, sinks, alibi)
    out = torch.empty_like(q)
    for bucket in buckets:
        out.index_copy_(0, bucket.rows, _decode_bucket(q, cache, bucket, scores, sinks, alibi))
    for i, q_len in enumerate(meta.query_lens_list):
        if q_len > 1:
            start = int(meta.query_start_loc[i])
            last = None if meta.visible_until is None else \
                meta.visible_until[start:start + q_len].unsqueeze(1)
            out[start:start + q_len] = _prefill_one(q[start:start + q_len], cache, meta, i,
                                                    scores, sinks, last, alibi)
    return out


def decode_buckets(meta: AttentionMetadata, block_size: int) -> list[DecodeBucket]:
    """The step's decode buckets, computed by the first layer and reused by the others."""
    key = f"decode_buckets/{block_size}"
    if key not in meta.step_cache:
        meta.step_cache[key] = _build_decode_buckets(meta, block_size)
    return meta.step_cache[key]


def _build_decode_buckets(meta: AttentionMetadata, block_size: int) -> list[DecodeBucket]:
    decode = sorted((i for i, n in enumerate(meta.query_lens_list) if n == 1),
                    key=lambda i: meta.seq_lens_list[i])
    device = meta.block_tables.device
    buckets = []
    # Sequences of similar length share a padded batch, so padding stays small.
    for start in range(0, len(decode), DECODE_BUCKET):
        seqs = decode[start:start + DECODE_BUCKET]
        index = torch.tensor(seqs, dtype=torch.long, device=device)
        num_blocks = -(-max(meta.seq_lens_list[i] for i in seqs) // block_size)
        blocks = meta.block_tables.index_select(0, index)[:, :num_blocks].reshape(-1)
        mask = None
        if len(seqs) > 1:
            positions = torch.arange(num_blocks * block_size, device=device)
            mask = positions.unsqueeze(0) < meta.seq_lens.index_select(0, index).unsqueeze(1)
            mask = mask[:, None, None, :]
        buckets.append(DecodeBucket(
            rows=meta.query_start_loc.index_select(0, index),
            lengths=meta.seq_lens.index_select(0, index),
            blocks=blocks.contiguous(), num_blocks=num_blocks, mask=mask,
            length=max(meta.seq_lens_list[i] for i in seqs),
            first_block=_first_of_consecutive(blocks) if len(seqs) == 1 else None,
        ))
    return buckets


def _first_of_consecutive(blocks: torch.Tensor) -> int | None:
    """blocks[0] where the blocks are blocks[0], blocks[0] + 1, ...; None otherwise. Read on
    the host, so only for CPU tensors: on a GPU it would wait for the device every step."""
    if blocks.device.type != "cpu":
        return None
    ids = blocks.tolist()
    return ids[0] if ids == list(range(ids[0], ids[0] + len(ids))) else None


def _read(cache: torch.Tensor, scales: torch.Tensor | None, blocks: torch.Tensor,
          dtype: torch.dtype) -> torch.Tensor:
    """The given blocks of one cache in dtype, dequantized when it has scales."""
    if scales is None:
        return _in_dtype(cache.index_select(0, blocks), None, dtype)
    # Gathered as bytes: index kernels do not cover float8 on every device.
    values = cache.view(torch.uint8).index_select(0, blocks).view(cache.dtype)
    return _in_dtype(values, scales.index_select(0, blocks), dtype)


def _in_dtype(values: torch.Tensor, scales: torch.Tensor | None,
              dtype: torch.dtype) -> torch.Tensor:
    """Cache values (and their scales, for a quantized cache) as dtype; no op when they are."""
    if scales is not None:
        return dequantize(values, scales, dtype)
    return values if values.dtype == dtype else values.to(dtype)


def _read_bucket(cache: torch.Tensor, scales: torch.Tensor | None, bucket: DecodeBucket,
                 dtype: torch.dtype) -> torch.Tensor:
    """The bucket's blocks of one cache in dtype: sliced, not gathered, where they are
    consecutive (a view when no conversion is needed)."""
    first = bucket.first_block
    if first is None:
        return _read(cache, scales, bucket.blocks, dtype)
    return _in_dtype(cache.narrow(0, first, bucket.num_blocks),
                     None if scales is None else scales.narrow(0, first, bucket.num_blocks),
                     dtype)


def gather_context(cache: torch.Tensor, scales: torch.Tensor | None, block_table: torch.Tensor,
            length: int, dtype: torch.dtype) -> torch.Tensor:
    """[length, kv_heads, dim] of one sequence's context, in token order."""
    num_blocks = -(-length // cache.shape[1])
    blocks = _read(cache, scales, block_table[:num_blocks], dtype)
    return blocks.reshape(-1, *cache.shape[2:])[:length]


def _prefill_one(q, cache: KVLayer, meta, i, scores: Scores, sinks: torch.Tensor | None,
                 last: torch.Tensor | None = None, alibi: torch.Tensor | None = None):
    """One sequence's chunk; `last` [q_len, 1]: the last position each query sees (None: its
    own)."""
    ctx = meta.seq_lens_list[i]
    q_len = q.shape[0]
    k = gather_context(cache.k, cache.k_scale, meta.block_tables[i], ctx, q.dtype)
    v = gather_context(cache.v, cache.v_scale, meta.block_tables[i], ctx, q.dtype)
    # 4-D inputs: with 3-D ones CPU SDPA falls back to its unfused math path (about 3x slower).
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    if ctx == q_len and scores.window is None and scores.softcap is None and sinks is None \
            and last is None and scores.chunk is None and alibi is None:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scores.scale,
                                           enable_gqa=True)
    else:
        query_pos = torch.arange(ctx - q_len, ctx, device=q.device).unsqueeze(1)
        key_pos = torch.arange(ctx, device=q.device).unsqueeze(0)
        visible = key_pos <= (query_pos if last is None else last)
        if scores.window is not None:
            visible &= key_pos > query_pos - scores.window
        if scores.chunk is not None:
            visible &= key_pos >= query_pos // scores.chunk * scores.chunk
        bias = None if alibi is None else alibi.view(-1, 1, 1) * (key_pos - query_pos)
        o = _attend(qh, kh, vh, visible, scores, None if sinks is None else sinks.view(-1, 1, 1),
                    bias)
    return o[0].transpose(0, 1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
            scores: Scores, sinks: torch.Tensor | None = None,
            bias: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA over [..., heads, len, dim], or, with a soft cap, sinks or a bias (which SDPA
    cannot apply as the reference models do), the same steps as their eager attention: weights
    in the input dtype, the softmax in float32. `sinks` broadcasts to the weights' shape but
    the last dimension (one logit per query row): a column each softmax takes and drops;
    `bias` (ALiBi's) broadcasts to the weights' shape and is added after the scale."""
    if scores.softcap is None and sinks is None and bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scores.scale,
                                              enable_gqa=True)
    group = q.shape[-3] // k.shape[-3]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    weights = torch.matmul(q, k.transpose(-1, -2)) * scores.scale
    if scores.softcap is not None:
        weights = torch.tanh(weights / scores.softcap) * scores.softcap
    if bias is not None:
        weights = weights + bias.to(weights.dtype)
    if visible is not None:
        weights = weights.masked_fill(~visible, float("-inf"))
    if sinks is None:
        weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        column = sinks.to(weights.dtype).expand(*weights.shape[:-1], 1)
        weights = torch.softmax(torch.cat([weights, column], dim=-1), dim=-1,
                                dtype=torch.float32)[..., :-1].to(q.dtype)
    return torch.matmul(weights, v)


def _decode_bucket(q, cache: KVLayer, bucket: DecodeBucket, scores: Scores,
                   sinks: torch.Tensor | None = None, alibi: torch.Tensor | None = None):
    """One query per sequence over its padded context; the query heads that share a K/V head
    ride along its query axis, so K/V are gathered once and never repeated."""
    batch = bucket.rows.shape[0]
    _, block_size, num_kv_heads, head_dim = cache.k.shape
    num_heads = q.shape[1]
    length = bucket.num_blocks * block_size
    k = _read_bucket(cache.k, cache.k_scale, bucket, q.dtype)
    v = _read_bucket(cache.v, cache.v_scale, bucket, q.dtype)
    k, v = (x.view(batch, length, num_kv_heads, head_dim) for x in (k, v))
    mask, bias = bucket.mask, None
    group = num_heads // num_kv_heads
    if mask is None:
        start = 0 if scores.window is None else max(bucket.length - scores.window, 0)
        if scores.chunk is not None:  # the query at length - 1 sees its own chunk
            start = max(start, (bucket.length - 1) // scores.chunk * scores.chunk)
        k, v = k[:, start:bucket.length], v[:, start:bucket.length]
        if alibi is not None:  # [kv heads, group, keys]: each key's distance behind the query
            behind = torch.arange(start - bucket.length + 1, 1, device=k.device)
            bias = alibi.view(num_kv_heads, group, 1) * behind
    else:
        positions = torch.arange(length, device=k.device)
        if scores.window is not None:
            mask = mask & (positions >= bucket.lengths.unsqueeze(1)
                           - scores.window)[:, None, None]
        if scores.chunk is not None:
            first = (bucket.lengths - 1) // scores.chunk * scores.chunk
            mask = mask & (positions >= first.unsqueeze(1))[:, None, None]
        if alibi is not None:  # [batch, kv heads, group, keys]
            behind = positions - (bucket.lengths.unsqueeze(1) - 1)
            bias = alibi.view(1, num_kv_heads, group, 1) * behind[:, None, None, :]
    rows = q if q.shape[0] == batch == 1 else q.index_select(0, bucket.rows)
    grouped = rows.view(batch, num_kv_heads, group, head_dim)
    o = _attend(grouped, k.transpose(1, 2), v.transpose(1, 2), mask, scores,
                None if sinks is None else sinks.view(num_kv_heads, -1, 1), bias)
    return o.reshape(batch, num_heads, head_dim)
