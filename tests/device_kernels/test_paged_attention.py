"""The paged torch attention equals dense causal attention over the same keys and values."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.paged_attention import Scores, paged_attention, write_kv


def _dense(q, k, v, scale, window=None, softcap=None, sinks=None, chunk=None, alibi=None):
    """Causal attention of the last len(q) positions over all of k/v (GQA by repetition); with
    a window, each position sees its last `window` positions; with a soft cap, scores pass
    through softcap * tanh(score / softcap); with sinks, each head's logit joins the softmax
    as one more column, then is dropped (transformers' GPT-OSS eager attention); with chunks,
    each position sees those of its own chunk (Llama 4); with ALiBi slopes, each head's slope
    times the key's position joins its scores (transformers' BLOOM, which softmax's shift
    invariance makes the same as the distance behind the query)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(k.shape[0] - q.shape[0], k.shape[0]).unsqueeze(1)
    k_pos = torch.arange(k.shape[0]).unsqueeze(0)
    if alibi is not None:
        scores = scores + alibi.view(-1, 1, 1) * k_pos
    hidden = k_pos > q_pos
    if window is not None:
        hidden |= k_pos <= q_pos - window
    if chunk is not None:
        hidden |= k_pos < q_pos // chunk * chunk
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        column = sinks.view(-1, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.cat([scores, column], dim=-1).softmax(-1)[..., :-1]
        return torch.einsum("hqk,khd->qhd", probs, v)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _batch(shapes: list[tuple[int, int]], block_size: int, heads: int, kv_heads: int,
           dim: int = 8, num_blocks: int = 64):
    """Sequences of (cached tokens, new tokens) in a paged cache with scattered blocks: the
    caches, the step's metadata, each sequence's queries and whole keys and values, and the
    step's row starts."""
    torch.manual_seed(0)
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    free = list(torch.randperm(num_blocks).tolist())
    tables, full_k, full_v, qs, slots = [], [], [], [], []
    for cached, new in shapes:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // block_size))]
        tables.append(table)
        k = torch.randn(total, kv_heads, dim)
        v = torch.randn(total, kv_heads, dim)
        full_k.append(k)
        full_v.append(v)
        positions = range(total)
        seq_slots = [table[p // block_size] * block_size + p % block_size for p in positions]
        write_kv(k[:cached], v[:cached], k_cache, v_cache, torch.tensor(seq_slots[:cached],
                                                                         dtype=torch.long))
        slots += seq_slots[cached:]
        qs.append(torch.randn(new, heads, dim))
    width = max(len(t) for t in tables)
    starts = [0]
    for _, new in shapes:
        starts.append(starts[-1] + new)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor([c + n for c, n in shapes]),
        query_start_loc=torch.tensor(starts),
        seq_lens_list=[c + n for c, n in shapes],
        query_lens_list=[n for _, n in shapes],
    )
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, shapes, strict=True)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, shapes, strict=True)])
    write_kv(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    return k_cache, v_cache, meta, qs, list(zip(full_k, full_v, strict=True)), starts


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("window,softcap,sinks", [(None, None, False), (5, None, False),
                                                  (None, 2.0, False), (16, 2.0, False),
                                                  (None, None, True), (5, None, True)])
def test_mixed_batch_of_prefill_chunks_and_decodes(block_size, heads, kv_heads, window,
                                                   softcap, sinks):
    dim = 8
    # (cached tokens, new tokens): fresh prefill, chunk after a prefix, decodes, partial blocks.
    shapes = [(0, 13), (9, 7), (20, 1), (3, 1), (0, 1), (31, 2)]
    k_cache, v_cache, meta, qs, full, starts = _batch(shapes, block_size, heads, kv_heads, dim)
    scale = dim ** -0.5
    sink_logits = torch.randn(heads) * 2 if sinks else None
    out = paged_attention(torch.cat(qs), k_cache, v_cache, meta, Scores(scale, window, softcap),
                          sinks=sink_logits)
    for i, q in enumerate(qs):
        expected = _dense(q, *full[i], scale, window, softcap, sink_logits)
        torch.testing.assert_close(out[starts[i]:starts[i + 1]], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads", [1, 6, 12, 32, 40, 71])
def test_alibi_slopes_are_transformers(heads):
    """BLOOM's slopes and MPT's (its bias_max: released models' 8 and another), against the
    functions transformers builds their biases with."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from tokenmill.engine.layers.alibi import alibi_slopes, mpt_alibi_slopes

    assert torch.equal(alibi_slopes(heads), _get_alibi_slopes(heads, "cpu"))
    for bias_max in (8, 12):  # the bias of the key one behind the last: minus the slope
        expected = -build_mpt_alibi_tensor(heads, 4, bias_max)[:, 0, -2]
        assert torch.equal(mpt_alibi_slopes(heads, bias_max), expected)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_alibi_slopes_bias_each_head_by_distance(heads, kv_heads):
    """BLOOM's ALiBi over prefill chunks, batched decodes and a lone one."""
    shapes = [(0, 13), (9, 7), (20, 1), (3, 1), (31, 2)]
    k_cache, v_cache, meta, qs, full, starts = _batch(shapes, 4, heads, kv_heads)
    slopes = 2.0 ** -torch.arange(1, heads + 1, dtype=torch.float32)
    out = paged_attention(torch.cat(qs), k_cache, v_cache, meta, Scores(0.5), alibi=slopes)
    for i, q in enumerate(qs):
        expected = _dense(q, *full[i], 0.5, alibi=slopes)
        torch.testing.assert_close(out[starts[i]:starts[i + 1]], expected, atol=1e-5, rtol=1e-5)
    lone = _batch([(21, 1)], 4, heads, kv_heads)
    out = paged_attention(lone[3][0], *lone[:3], Scores(0.5), alibi=slopes)
    torch.testing.assert_close(out, _dense(lone[3][0], *lone[4][0], 0.5, alibi=slopes),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("chunk", [4, 10])
def test_chunked_attention_sees_each_querys_own_chunk(block_size, chunk):
    """Llama 4's chunks: prompt chunks crossing chunk boundaries, and decodes (batched, and a
    lone one) at a chunk's first position and further in."""
    shapes = [(0, 13), (9, 7), (20, 1), (19, 1), (0, 1), (31, 2)]
    k_cache, v_cache, meta, qs, full, starts = _batch(shapes, block_size, 4, 2)
    out = paged_attention(torch.cat(qs), k_cache, v_cache, meta, Scores(0.5, chunk=chunk))
    for i, q in enumerate(qs):
        expected = _dense(q, *full[i], 0.5, chunk=chunk)
        torch.testing.assert_close(out[starts[i]:starts[i + 1]], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [None, torch.int8])
@pytest.mark.parametrize("consecutive", [True, False])
def test_a_lone_decoding_sequence_reads_its_blocks_in_place_or_gathered(kv_dtype, consecutive):
    """One decoding sequence whose blocks follow each other in the pool is read as a slice of
    the cache instead of a gathered copy: same output as dense attention, either way."""
    from tokenmill.engine.layers.kv_quant import dequantize, quantize
    from tokenmill.engine.layers.paged_attention import decode_buckets

    torch.manual_seed(0)
    block_size, kv_heads, heads, dim, num_blocks, length = 4, 2, 6, 8, 16, 14
    table = [5, 6, 7, 8] if consecutive else [9, 2, 3, 12]
    k = torch.randn(length, kv_heads, dim)
    v = torch.randn(length, kv_heads, dim)
    shape = (num_blocks, block_size, kv_heads, dim)
    k_cache = torch.zeros(shape, dtype=kv_dtype or torch.float32)
    v_cache = torch.zeros_like(k_cache)
    k_scale = v_scale = None
    if kv_dtype is not None:
        k_scale, v_scale = torch.ones(shape[:3]), torch.ones(shape[:3])
        # The reference attends to what the cache can hold: the values after a round trip.
        k, v = (dequantize(*quantize(x, kv_dtype), torch.float32) for x in (k, v))
    slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                          for p in range(length)])
    write_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    meta = AttentionMetadata(
        slot_mapping=slots[-1:], block_tables=torch.tensor([table]),
        seq_lens=torch.tensor([length]), query_start_loc=torch.tensor([0, 1]),
        seq_lens_list=[length], query_lens_list=[1],
    )
    q = torch.randn(1, heads, dim)
    out = paged_attention(q, k_cache, v_cache, meta, dim ** -0.5, k_scale, v_scale)
    assert decode_buckets(meta, block_size)[0].first_block == (5 if consecutive else None)
    torch.testing.assert_close(out, _dense(q, k, v, dim ** -0.5), atol=1e-5, rtol=1e-5)
