"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5) over the paged cache, in torch.

A lightning indexer scores each query against every position of its context with a few small
heads, sum over heads of weight * relu(q . k); the query then attends to the `topk` positions
scoring highest only. Where a context is no longer than `topk` every position is chosen, which
is dense attention: only longer contexts take this path (the layer runs the others through the
ordinary kernels). The indexer's key of each token is cached in the same row as the latent
attention's, past its end (`key_start`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.paged_attention import gather_context

# Index scores are computed for this many (query row x head x context position) numbers at a
# time, so a long prompt's chunk scores in slices instead of one tensor that size.
SCORE_ELEMENTS = 1 << 26


class IndexQueries(NamedTuple):
    """The indexer's side of a step: its rotated queries [tokens, heads, dim] and each head's
    weight per query [tokens, heads] (float32, times heads ** -0.5 and dim ** -0.5)."""

    q: torch.Tensor
    weights: torch.Tensor


def sparse_sequences(meta: AttentionMetadata, topk: int) -> list[int]:
    """The step's sequences whose context is longer than `topk`: those whose queries do not
    see every position."""
    return [i for i, n in enumerate(meta.seq_lens_list) if n > topk]


def select(index: IndexQueries, cache: KVLayer, meta: AttentionMetadata, key_start: int,
           topk: int) -> dict[int, torch.Tensor]:
    """For each sequence longer than `topk`: [query rows, context] True where a query attends,
    its `topk` best-scored positions among those it may see (causally)."""
    chosen = {}
    starts = _starts(meta)
    for i in sparse_sequences(meta, topk):
        ctx, q_len, start = meta.seq_lens_list[i], meta.query_lens_list[i], starts[i]
        keys = gather_context(cache.k, cache.k_scale, meta.block_tables[i], ctx,
                              torch.float32)[:, 0, key_start:]
        visible = _causal(ctx, q_len, keys.device)
        rows = max(1, SCORE_ELEMENTS // (index.q.shape[1] * ctx))
        masks = []
        for first in range(0, q_len, rows):
            last = min(first + rows, q_len)
            q = index.q[start + first:start + last].float()
            per_head = F.relu(torch.einsum("thd,cd->thc", q, keys))
            score = torch.einsum("th,thc->tc", index.weights[start + first:start + last],
                                 per_head)
            seen = visible[first:last]
            best = score.masked_fill(~seen, float("-inf")).topk(topk, dim=-1).indices
            masks.append(torch.zeros_like(seen).scatter_(-1, best, True) & seen)
        chosen[i] = torch.cat(masks)
    return chosen


def attend_chosen(query: torch.Tensor, cache: KVLayer, meta: AttentionMetadata,
                  chosen: dict[int, torch.Tensor], scale: float, out: torch.Tensor) -> None:
    """Attention of each chosen sequence's queries ([tokens, heads, width], over a single-head
    cache whose rows start with the same `width`) to its chosen positions, written into those
    rows of `out` ([tokens, heads, width])."""
    width = query.shape[-1]
    starts = _starts(meta)
    for i, mask in chosen.items():
        ctx, q_len, start = meta.seq_lens_list[i], meta.query_lens_list[i], starts[i]
        rows = gather_context(cache.k, cache.k_scale, meta.block_tables[i], ctx,
                              query.dtype)[:, :, :width]
        q = query[start:start + q_len].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, width]
        kv = rows.transpose(0, 1).unsqueeze(0)  # [1, 1, ctx, width]
        o = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, scale=scale,
                                           enable_gqa=True)
        out[start:start + q_len] = o[0].transpose(0, 1)


def _starts(meta: AttentionMetadata) -> list[int]:
    """Each sequence's first query row, from the host's lengths."""
    starts, row = [], 0
    for n in meta.query_lens_list:
        starts.append(row)
        row += n
    return starts


def _causal(ctx: int, q_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, ctx]: True where the query (the sequence's last q_len positions) may see."""
    query_pos = torch.arange(ctx - q_len, ctx, device=device).unsqueeze(1)
    return torch.arange(ctx, device=device).unsqueeze(0) <= query_pos
