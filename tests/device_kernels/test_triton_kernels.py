"""The Triton kernels equal the torch paged attention (the oracle) on the same paged batches.

Without a GPU they run in Triton's CPU interpreter on small shapes; with one, the same cases run
compiled on the GPU, plus real-size cases in bfloat16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_support import DEVICE, cuda_only, paged_batch

from tokenmill.engine.kernels.decode_attention import decode_attention
from tokenmill.engine.kernels.kv_write import kv_write
from tokenmill.engine.kernels.prefill_attention import prefill_attention
from tokenmill.engine.layers.attention import attention, store_kv
from tokenmill.engine.layers.paged_attention import Scores, paged_attention, write_kv

GQA = [(2, 2), (6, 2), (8, 1)]  # (query heads, K/V heads): group sizes 1, 3 and 8
FP32 = {"atol": 2e-5, "rtol": 2e-5}
BF16 = {"atol": 2e-2, "rtol": 2e-2}


def _reference(batch, scale):
    """Torch paged attention in float32 over a float32 copy of the batch's caches."""
    k_cache, v_cache = batch.k_cache.float(), batch.v_cache.float()
    write_kv(batch.new_k.float(), batch.new_v.float(), k_cache, v_cache, batch.meta.slot_mapping)
    return paged_attention(batch.q.float(), k_cache, v_cache, batch.meta, scale)


# (window, softcap): a window shorter than a tile and one spanning tiles, Gemma 2's soft cap
# (scores scaled up so it bites), and both.
WINDOWS = [(5, None), (37, None), (None, 1.5), (20, 1.5)]


@pytest.mark.parametrize("window,softcap", WINDOWS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_with_a_window_or_soft_cap_equals_torch(window, softcap, num_splits):
    batch = paged_batch([(0, 1), (16, 1), (40, 1), (70, 1)], 6, 2, 16, 16)
    scores = Scores(0.7, window, softcap)
    expected = _reference(batch, scores)
    _fill(batch)
    meta = batch.meta
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, max(meta.seq_lens_list), scores.scale,
                           num_splits=num_splits, block_n=16, window=window, softcap=softcap)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("window,softcap", WINDOWS)
def test_prefill_with_a_window_or_soft_cap_equals_torch(window, softcap):
    # Chunks longer than a window, so some rows of a tile see no key of its first tiles.
    batch = paged_batch([(0, 45), (19, 30), (32, 5), (45, 1)], 6, 2, 16, 16)
    scores = Scores(0.7, window, softcap)
    expected = _reference(batch, scores)
    _fill(batch)
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc,
                            scores.scale, block_m=16, block_n=16, window=window,
                            softcap=softcap)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("chunk", [5, 32])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_in_chunks_equals_torch(chunk, num_splits):
    """Llama 4's chunked attention: each query sees its own chunk, shorter than a tile or
    spanning tiles, from its first position (40 = a chunk's start under 5) on."""
    batch = paged_batch([(0, 1), (16, 1), (40, 1), (70, 1)], 6, 2, 16, 16)
    scores = Scores(0.7, chunk=chunk)
    expected = _reference(batch, scores)
    _fill(batch)
    meta = batch.meta
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, max(meta.seq_lens_list), scores.scale,
                           num_splits=num_splits, block_n=16, chunk=chunk)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("chunk", [5, 32])
def test_prefill_in_chunks_equals_torch(chunk):
    """Prompt chunks crossing attention chunks, so a tile's rows start in different ones."""
    batch = paged_batch([(0, 45), (19, 30), (32, 5), (45, 1)], 6, 2, 16, 16)
    scores = Scores(0.7, chunk=chunk)
    expected = _reference(batch, scores)
    _fill(batch)
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc, scores.scale, block_m=16,
                            block_n=16, chunk=chunk)
    torch.testing.assert_close(out, expected, **FP32)


def _with_sinks(shapes, window):
    """A paged batch, a sink logit per head, and the torch reference's output with them."""
    batch = paged_batch(shapes, 6, 2, 16, 16)
    sinks = torch.randn(6, generator=torch.Generator().manual_seed(1)).to(DEVICE) * 2
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv(batch.new_k, batch.new_v, k_cache, v_cache, batch.meta.slot_mapping)
    expected = paged_attention(batch.q, k_cache, v_cache, batch.meta, Scores(0.7, window),
                               sinks=sinks)
    _fill(batch)
    return batch, sinks, expected


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_with_sinks_equals_torch(window, num_splits):
    batch, sinks, expected = _with_sinks([(0, 1), (16, 1), (40, 1), (70, 1)], window)
    meta = batch.meta
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, max(meta.seq_lens_list), 0.7, num_splits=num_splits,
                           block_n=16, window=window, sinks=sinks)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("window", [None, 5])
def test_prefill_with_sinks_equals_torch(window):
    batch, sinks, expected = _with_sinks([(0, 45), (19, 30), (32, 5), (45, 1)], window)
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc,
                            0.7, block_m=16, block_n=16, window=window, sinks=sinks)
    torch.testing.assert_close(out, expected, **FP32)


def _with_alibi(shapes):
    """A paged batch, an ALiBi slope per head, and the torch reference's output with them."""
    batch = paged_batch(shapes, 6, 2, 16, 16)
    slopes = (2.0 ** -torch.arange(1, 7, dtype=torch.float32)).to(DEVICE)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv(batch.new_k, batch.new_v, k_cache, v_cache, batch.meta.slot_mapping)
    expected = paged_attention(batch.q, k_cache, v_cache, batch.meta, Scores(0.7), alibi=slopes)
    _fill(batch)
    return batch, slopes, expected


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_with_alibi_equals_torch(num_splits):
    batch, slopes, expected = _with_alibi([(0, 1), (16, 1), (40, 1), (70, 1)])
    meta = batch.meta
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, max(meta.seq_lens_list), 0.7, num_splits=num_splits,
                           block_n=16, alibi=slopes)
    torch.testing.assert_close(out, expected, **FP32)


def test_prefill_with_alibi_equals_torch():
    batch, slopes, expected = _with_alibi([(0, 45), (19, 30), (32, 5), (45, 1)])
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc, 0.7, block_m=16, block_n=16,
                            alibi=slopes)
    torch.testing.assert_close(out, expected, **FP32)


def _fill(batch):
    write_kv(batch.new_k, batch.new_v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping)


@pytest.mark.parametrize("block_size", [16, 32])
def test_kv_write_stores_every_token_at_its_slot_and_skips_padding(block_size):
    batch = paged_batch([(5, 3), (0, 20), (31, 1), (16, 17)], 4, 2, 16, block_size)
    expected_k, expected_v = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv(batch.new_k, batch.new_v, expected_k, expected_v, batch.meta.slot_mapping)
    # A padding row (slot -1) is skipped; its values would otherwise land somewhere.
    slots = torch.cat([batch.meta.slot_mapping, torch.tensor([-1], device=DEVICE)])
    k = torch.cat([batch.new_k, torch.full_like(batch.new_k[:1], 7.0)])
    v = torch.cat([batch.new_v, torch.full_like(batch.new_v[:1], 7.0)])
    kv_write(k, v, batch.k_cache, batch.v_cache, slots)
    assert torch.equal(batch.k_cache, expected_k) and torch.equal(batch.v_cache, expected_v)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", GQA)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_equals_torch(block_size, heads, kv_heads, num_splits):
    # Partial last blocks, a one-token context, and contexts shorter than a split (empty splits).
    batch = paged_batch([(0, 1), (16, 1), (40, 1), (70, 1)], heads, kv_heads, 16, block_size)
    scale = 16 ** -0.5
    expected = _reference(batch, scale)
    _fill(batch)
    meta = batch.meta
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, max(meta.seq_lens_list), scale,
                           num_splits=num_splits, block_n=16)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_prefill_and_extend_equal_torch(block_size, heads, kv_heads):
    # A fresh prompt, chunks after a cached prefix (one ends mid-block), a decode in the batch.
    shapes = [(0, 21), (19, 12), (32, 5), (45, 1)]
    batch = paged_batch(shapes, heads, kv_heads, 16, block_size)
    scale = 16 ** -0.5
    expected = _reference(batch, scale)
    _fill(batch)
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc, scale,
                            block_m=16, block_n=16)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_a_step_of_many_decodes_and_one_long_chunk_launches_about_its_rows(heads, kv_heads,
                                                                           monkeypatch):
    """Sequences find their tiles by binary search over the step's rows: decodes before and
    after a chunk spanning many tiles, a one-token context, a chunk after a cached prefix. The
    grid is about rows / block_m + sequences, not (longest chunk's tiles) x sequences."""
    from tokenmill.engine.kernels import prefill_attention as module

    shapes = [(7, 1)] * 9 + [(0, 53)] + [(30, 1), (0, 1), (19, 12)] + [(11, 1)] * 6
    batch = paged_batch(shapes, heads, kv_heads, 16, 16)
    scale = 16 ** -0.5
    expected = _reference(batch, scale)
    _fill(batch)
    grids = []
    kernel = module._prefill_kernel
    monkeypatch.setattr(module, "_prefill_kernel", _GridRecorder(kernel, grids))
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc, scale, block_m=16, block_n=16)
    torch.testing.assert_close(out, expected, **FP32)
    group = heads // kv_heads
    rows = sum(n for _, n in shapes) * group
    assert grids == [(rows // 16 + len(shapes), kv_heads)]
    longest_first = -(-53 * group // 16) * len(shapes)  # the grid sized by the longest chunk
    assert grids[0][0] < longest_first / 2


@dataclasses.dataclass
class _GridRecorder:
    """Stands in for a Triton kernel: notes each launch's grid, then launches it."""

    kernel: object
    grids: list

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_head_dim_that_is_not_a_power_of_two():
    batch = paged_batch([(10, 6), (33, 1)], 4, 2, 24, 16)
    scale = 24 ** -0.5
    expected = _reference(batch, scale)
    _fill(batch)
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc, scale, block_m=16, block_n=16)
    torch.testing.assert_close(out, expected, **FP32)
    rows = meta.query_start_loc[1:] - 1
    out = decode_attention(batch.q[rows], batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, 34, scale, num_splits=2, block_n=16)
    torch.testing.assert_close(out[1], expected[-1], **FP32)


@cuda_only
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(32, 32), (24, 8), (64, 8)])
def test_real_sizes_on_gpu(block_size, heads, kv_heads):
    decodes = [(n, 1) for n in (1, 17, 500, 2047, 4095, 8000)]
    chunks = [(0, 700), (1500, 512), (3000, 257), (100, 1)]
    for shapes in (decodes, chunks):
        batch = paged_batch(shapes, heads, kv_heads, 128, block_size, dtype=torch.bfloat16)
        scale = 128 ** -0.5
        expected = _reference(batch, scale)
        kv_write(batch.new_k, batch.new_v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping)
        meta = batch.meta
        if max(meta.query_lens_list) == 1:
            out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                                   meta.seq_lens, max(meta.seq_lens_list), scale)
        else:
            out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                                    meta.seq_lens, meta.query_start_loc, scale)
        torch.testing.assert_close(out.float(), expected, **BF16)


@pytest.mark.parametrize("shapes", [[(0, 1), (20, 1), (47, 1)], [(12, 1), (0, 9), (33, 4)]])
def test_engine_dispatch_runs_decode_and_mixed_steps_on_the_kernels(shapes):
    batch = paged_batch(shapes, 6, 2, 16, 16)
    scale = 16 ** -0.5
    expected = _reference(batch, scale)
    meta = dataclasses.replace(batch.meta, backend="triton")
    store_kv(batch.new_k, batch.new_v, batch.layer, meta)
    out = attention(batch.q, batch.layer, meta, scale)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("window", [None, 37])
def test_prefill_rows_that_see_a_whole_image_equal_torch_and_a_dense_mask(window):
    """Rows of an image see every row of it, later ones too (Gemma 3's images): the kernel,
    the torch path and attention over an explicit mask agree."""
    batch = paged_batch([(0, 45), (19, 30), (32, 5)], 6, 2, 16, 16)
    positions = [*range(0, 45), *range(19, 49), *range(32, 37)]
    last = list(positions)
    for lo, hi in ((0 + 10, 0 + 30), (45 + 6, 45 + 22)):  # rows of two images
        last[lo:hi] = [positions[hi - 1]] * (hi - lo)
    batch.meta.visible_until = torch.tensor(last, dtype=torch.long, device=DEVICE)
    scores = Scores(0.7, window)
    expected = _reference(batch, scores)
    # The first sequence has no cache before it: attention over its own rows, masked by hand.
    q, k, v = (t[:45].float() for t in (batch.q, batch.new_k, batch.new_v))
    key_pos = torch.arange(45, device=DEVICE)
    visible = key_pos[None, :] <= torch.tensor(last[:45], device=DEVICE)[:, None]
    if window:
        visible &= key_pos[None, :] > key_pos[:, None] - window
    weights = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(3, dim=1)) * 0.7
    dense = torch.einsum("hqk,khd->qhd", weights.masked_fill(~visible, float("-inf"))
                         .softmax(-1), v.repeat_interleave(3, dim=1))
    torch.testing.assert_close(expected[:45], dense, **FP32)
    assert not torch.allclose(expected[10:30], _reference(
        dataclasses.replace(batch, meta=dataclasses.replace(batch.meta, visible_until=None)),
        scores)[10:30])  # the image's rows do see past themselves
    _fill(batch)
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc,
                            scores.scale, block_m=16, block_n=16, window=window,
                            visible_until=meta.visible_until)
    torch.testing.assert_close(out, expected, **FP32)
