"""Attention over int8 and fp8 (e4m3, e5m2) KV caches: the torch reference against unquantized
attention, and the Triton kernels against the torch reference on the same quantized caches.

Triton's interpreter reads fp8 correctly but rounds float32 to fp8 wrongly near powers of two
(31.6 becomes 16, not 32), so fp8 kv_write is checked only on a GPU; the attention kernels read
fp8 caches written by the torch quantizer, so they are checked in the interpreter too.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_support import DEVICE, FP8_GPU, cuda_only, paged_batch

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.kernels.decode_attention import decode_attention
from tokenmill.engine.kernels.kv_write import kv_write
from tokenmill.engine.kernels.prefill_attention import prefill_attention
from tokenmill.engine.layers.attention import attention, store_kv
from tokenmill.engine.layers.paged_attention import paged_attention, write_kv

INT8, FP8, E5M2 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2
FP32 = {"atol": 2e-5, "rtol": 2e-5}
BF16 = {"atol": 2e-2, "rtol": 2e-2}
MIXED = [(0, 21), (19, 12), (32, 5), (45, 1)]  # fresh prompt, chunks after a prefix, a decode
DECODES = [(0, 1), (16, 1), (40, 1), (70, 1)]
fp8_stores = pytest.mark.skipif(
    not FP8_GPU,
    reason="fp8 stores need a GPU of compute capability 8.9+ (the interpreter rounds them wrongly)")


def _filled(batch):
    """The batch with its new K/V stored by the torch reference (quantized when it is)."""
    write_kv(batch.new_k, batch.new_v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping,
             batch.k_scale, batch.v_scale)
    return batch


def _reference(batch, scale):
    return paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale,
                           batch.k_scale, batch.v_scale)


@pytest.mark.parametrize("kv_dtype,atol", [(INT8, 0.04), (FP8, 0.2), (E5M2, 0.3)])
@pytest.mark.parametrize("shapes", [MIXED, DECODES])
def test_reference_over_quantized_caches_stays_near_unquantized(kv_dtype, atol, shapes):
    """Unit-variance K/V over head_dim 16: int8 moves each element by at most amax/254 (~0.01),
    fp8 by at most 1/16 of itself (e5m2: 1/8); the attention output moves by about as much.
    Over five seeds the largest output error measured 0.022 (int8), 0.097 (fp8) and 0.15
    (fp8_e5m2): `atol` is twice that."""
    args = (shapes, 6, 2, 16, 16)
    exact = _filled(paged_batch(*args))
    quant = _filled(paged_batch(*args, kv_dtype=kv_dtype))
    assert quant.k_cache.dtype == kv_dtype and quant.k_scale is not None
    scale = 16 ** -0.5
    torch.testing.assert_close(_reference(quant, scale), _reference(exact, scale),
                               atol=atol, rtol=0)


@pytest.mark.parametrize("kv_dtype", [INT8, FP8, E5M2])
def test_reference_reads_the_dequantized_values(kv_dtype):
    """Quantized attention is attention over the caches' dequantized values: same math."""
    batch = _filled(paged_batch(MIXED + DECODES, 6, 2, 16, 16, kv_dtype=kv_dtype))
    k = batch.k_cache.float() * batch.k_scale.unsqueeze(-1)
    v = batch.v_cache.float() * batch.v_scale.unsqueeze(-1)
    scale = 16 ** -0.5
    torch.testing.assert_close(_reference(batch, scale),
                               paged_attention(batch.q, k, v, batch.meta, scale), **FP32)


@pytest.mark.parametrize("head_dim", [16, 24])
def test_int8_kv_write_stores_the_reference_codes_and_scales(head_dim):
    batch = paged_batch(MIXED, 4, 2, head_dim, 16, kv_dtype=INT8)
    batch.new_k[3] = 0.0  # a zero row: scale 1, codes 0
    expected = dataclasses.replace(batch, k_cache=batch.k_cache.clone(),
                                   v_cache=batch.v_cache.clone(), k_scale=batch.k_scale.clone(),
                                   v_scale=batch.v_scale.clone())
    _filled(expected)
    # A padding row (slot -1) is skipped.
    slots = torch.cat([batch.meta.slot_mapping, torch.tensor([-1], device=DEVICE)])
    k = torch.cat([batch.new_k, torch.full_like(batch.new_k[:1], 7.0)])
    v = torch.cat([batch.new_v, torch.full_like(batch.new_v[:1], 7.0)])
    kv_write(k, v, batch.k_cache, batch.v_cache, slots, batch.k_scale, batch.v_scale)
    # The interpreter divides exactly as torch does; a GPU's division may land a value that sits
    # on a rounding boundary one code away.
    codes = {"atol": 0 if DEVICE.type == "cpu" else 1, "rtol": 0}
    torch.testing.assert_close(batch.k_cache.float(), expected.k_cache.float(), **codes)
    torch.testing.assert_close(batch.v_cache.float(), expected.v_cache.float(), **codes)
    torch.testing.assert_close(batch.k_scale, expected.k_scale, **FP32)
    torch.testing.assert_close(batch.v_scale, expected.v_scale, **FP32)
    assert batch.k_scale.view(-1, 2)[batch.meta.slot_mapping[3]].tolist() == [1.0, 1.0]


@fp8_stores
@pytest.mark.parametrize("kv_dtype,mantissa_bits", [(FP8, 3), (E5M2, 2)])
def test_fp8_kv_write_stores_the_reference_values_and_scales(kv_dtype, mantissa_bits):
    batch = paged_batch(MIXED, 4, 2, 16, 16, kv_dtype=kv_dtype)
    expected = dataclasses.replace(batch, k_cache=batch.k_cache.clone(),
                                   v_cache=batch.v_cache.clone(), k_scale=batch.k_scale.clone(),
                                   v_scale=batch.v_scale.clone())
    _filled(expected)
    kv_write(batch.new_k, batch.new_v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping,
             batch.k_scale, batch.v_scale)
    # At most one step (1/8 of the value in e4m3, 1/4 in e5m2) where a division lands on a
    # rounding boundary; the smallest subnormal step below.
    step = {"rtol": 2.0 ** -mantissa_bits, "atol": 2 ** -9 if kv_dtype == FP8 else 2 ** -16}
    torch.testing.assert_close(batch.k_cache.float(), expected.k_cache.float(), **step)
    torch.testing.assert_close(batch.v_cache.float(), expected.v_cache.float(), **step)
    torch.testing.assert_close(batch.k_scale, expected.k_scale, **FP32)


@pytest.mark.parametrize("kv_dtype", [INT8, FP8, E5M2])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (6, 2)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_kernel_equals_the_reference_on_quantized_caches(kv_dtype, heads, kv_heads,
                                                                num_splits):
    batch = _filled(paged_batch(DECODES, heads, kv_heads, 16, 16, kv_dtype=kv_dtype))
    scale = 16 ** -0.5
    meta = batch.meta
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                           meta.seq_lens, max(meta.seq_lens_list), scale, num_splits=num_splits,
                           block_n=16, k_scale=batch.k_scale, v_scale=batch.v_scale)
    torch.testing.assert_close(out, _reference(batch, scale), **FP32)


@pytest.mark.parametrize("kv_dtype", [INT8, FP8, E5M2])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(2, 2, 16), (6, 2, 16), (4, 2, 24)])
def test_prefill_kernel_equals_the_reference_on_quantized_caches(kv_dtype, heads, kv_heads,
                                                                 head_dim):
    batch = _filled(paged_batch(MIXED, heads, kv_heads, head_dim, 16, kv_dtype=kv_dtype))
    scale = head_dim ** -0.5
    meta = batch.meta
    out = prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables,
                            meta.seq_lens, meta.query_start_loc,
                            scale, block_m=16, block_n=16, k_scale=batch.k_scale,
                            v_scale=batch.v_scale)
    torch.testing.assert_close(out, _reference(batch, scale), **FP32)


@pytest.mark.parametrize("shapes", [DECODES, MIXED])
def test_engine_dispatch_writes_and_attends_int8_on_the_kernels(shapes):
    expected_batch = _filled(paged_batch(shapes, 6, 2, 16, 16, kv_dtype=INT8))
    scale = 16 ** -0.5
    expected = _reference(expected_batch, scale)
    batch = paged_batch(shapes, 6, 2, 16, 16, kv_dtype=INT8)
    meta = dataclasses.replace(batch.meta, backend="triton")
    store_kv(batch.new_k, batch.new_v, batch.layer, meta)
    torch.testing.assert_close(attention(batch.q, batch.layer, meta, scale), expected, **FP32)


def test_int8_greedy_output_is_the_same_through_the_kernels(tiny_llama_dir):
    prompts = [list(range(200, 230)), [5, 6, 7], list(range(900, 917))]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 24,
               "max_num_seqs": 4, "device": DEVICE.type, "kv_cache_dtype": "int8",
               "kv_cache_memory": 1 << 20}
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(tiny_llama_dir, attention_backend=backend, **options)
        outputs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outputs["triton"] == outputs["torch"]


@cuda_only
@pytest.mark.parametrize("kv_dtype", [INT8, pytest.param(FP8, marks=fp8_stores),
                                      pytest.param(E5M2, marks=fp8_stores)])
def test_real_sizes_on_gpu(kv_dtype):
    decodes = [(n, 1) for n in (1, 17, 500, 2047, 4095, 8000)]
    chunks = [(0, 700), (1500, 512), (3000, 257), (100, 1)]
    for shapes in (decodes, chunks):
        batch = paged_batch(shapes, 32, 8, 128, 16, dtype=torch.bfloat16, kv_dtype=kv_dtype)
        kv_write(batch.new_k, batch.new_v, batch.k_cache, batch.v_cache,
                 batch.meta.slot_mapping, batch.k_scale, batch.v_scale)
        scale = 128 ** -0.5
        expected = _reference(batch, scale).float()
        meta = dataclasses.replace(batch.meta, backend="triton")
        out = attention(batch.q, batch.layer, meta, scale)
        torch.testing.assert_close(out.float(), expected, **BF16)
