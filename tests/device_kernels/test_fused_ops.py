"""The fused elementwise kernels equal their torch references, and the references equal Hugging
Face's ops bit for bit, so greedy output stays equal to HF's on either backend.

Without a GPU the kernels run in Triton's CPU interpreter on small shapes, in float32 and
float16 (the interpreter truncates float32 to bfloat16 instead of rounding, so bfloat16 kernel
cases run on a GPU only). Inputs are views with row strides, as the model passes them.
"""

from __future__ import annotations

import pytest
import torch
from triton_support import DEVICE, cuda_only

from tokenmill.engine.kernels.activation import silu_and_mul as silu_and_mul_kernel
from tokenmill.engine.kernels.rms_norm import rms_norm as rms_norm_kernel
from tokenmill.engine.kernels.rotary import rotary
from tokenmill.engine.layers.activation import silu_and_mul
from tokenmill.engine.layers.norm import rms_norm
from tokenmill.engine.layers.rotary import RotaryEmbedding, apply_rotary, rope_parameters

# The kernels reduce (rms_norm) and exponentiate (silu) in their own order and precision: one
# unit in the last place of the dtype, at most. Rotary does the same float ops as torch: exact.
TOLERANCE = {torch.float32: {"atol": 1e-6, "rtol": 1e-6},
             torch.float16: {"atol": 1e-3, "rtol": 1e-3},
             torch.bfloat16: {"atol": 1e-2, "rtol": 8e-3}}
INTERPRETED = [torch.float32, torch.float16]
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


def _rows_view(rows, width, dtype, seed, scale=1.0):
    """[rows, width] as a view into wider rows (a row stride that is not the width)."""
    return _randn(rows, width + 24, dtype=dtype, scale=scale, seed=seed)[:, 8:8 + width]


def _qkv(tokens, heads, kv_heads, dim, dtype):
    """q, k, v views of one merged projection output, as Attention makes them."""
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, scale=2.0)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return (qkv, q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim),
            v.view(tokens, kv_heads, dim))


# --- kernels against the torch references ---------------------------------------------------

@pytest.mark.parametrize("dtype", INTERPRETED)
@pytest.mark.parametrize("size", [40, 64])
def test_rms_norm_kernel_equals_torch(dtype, size):
    x = _rows_view(5, size, dtype, seed=1)
    weight = _randn(size, dtype=dtype, seed=2)
    residual = _rows_view(5, size, dtype, seed=3, scale=4.0)
    expected, expected_stream = rms_norm(x, weight, 1e-5, residual)
    out, stream = rms_norm_kernel(x, weight, 1e-5, residual)
    # The stream is written over the caller's residual; the sum is rounded exactly as torch's.
    assert stream is residual and torch.equal(stream, expected_stream)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    out, stream = rms_norm(x, weight, 1e-5, backend="triton")  # no residual: the stream is x
    assert stream is x
    torch.testing.assert_close(out, rms_norm(x, weight, 1e-5)[0], **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", INTERPRETED)
def test_rms_norm_kernel_with_a_unit_offset_equals_torch(dtype):
    """Gemma's norm: 1 + weight, applied in float32 before the rounding."""
    x = _rows_view(5, 40, dtype, seed=1)
    weight = _randn(40, dtype=dtype, seed=2)
    residual = _rows_view(5, 40, dtype, seed=3, scale=4.0)
    expected, expected_stream = rms_norm(x, weight, 1e-6, residual.clone(), unit_offset=True)
    plain, _ = rms_norm(x, weight, 1e-6, residual.clone())  # Llama's norm, for contrast
    out, stream = rms_norm_kernel(x, weight, 1e-6, residual, unit_offset=True)
    assert torch.equal(stream, expected_stream)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    assert not torch.allclose(out, plain, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", INTERPRETED)
def test_rms_norm_kernel_normalizes_each_head_of_a_strided_q(dtype):
    _, q, k, _ = _qkv(3, 4, 2, 24, dtype)  # Qwen3's q_norm/k_norm over each head
    weight = _randn(24, dtype=dtype, seed=4)
    for x in (q, k):
        out, _ = rms_norm_kernel(x, weight, 1e-6)
        torch.testing.assert_close(out, rms_norm(x, weight, 1e-6)[0], **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", INTERPRETED)
@pytest.mark.parametrize("heads,kv_heads,dim,partial", [(4, 2, 16, 1.0), (6, 2, 24, 1.0),
                                                        (3, 3, 8, 1.0), (4, 2, 16, 0.75)])
def test_rotary_kernel_equals_torch_in_place(dtype, heads, kv_heads, dim, partial):
    """Partial: the first three quarters of each head rotate, the rest stay as they were."""
    qkv, q, k, v = _qkv(7, heads, kv_heads, dim, dtype)
    rope = RotaryEmbedding(dim, 300, {"rope_theta": 10000.0, "rope_type": "default",
                                      "partial_rotary_factor": partial}).to(DEVICE)
    positions = torch.tensor([0, 1, 5, 17, 100, 299, 3], device=DEVICE)
    rows = rope(positions, dtype)
    expected_q, expected_k = rows.rotate(q, k)
    v_before, q_before = v.clone(), q.clone()
    out_q, out_k = rope(positions, dtype, backend="triton").rotate(q, k)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)
    assert torch.equal(v, v_before)
    rotated = int(dim * partial)
    assert torch.equal(q[..., rotated:], q_before[..., rotated:])
    assert not torch.equal(q[..., :rotated], q_before[..., :rotated])


@pytest.mark.parametrize("dtype", INTERPRETED)
@pytest.mark.parametrize("width", [40, 1100])  # one column block, and several with a partial one
def test_silu_and_mul_kernel_equals_torch(dtype, width):
    gate_up = _randn(3, 2 * width, dtype=dtype, scale=3.0, seed=5)
    gate, up = gate_up.split([width, width], dim=-1)
    expected = silu_and_mul(gate, up)
    torch.testing.assert_close(silu_and_mul_kernel(gate, up), expected, **TOLERANCE[dtype])
    torch.testing.assert_close(silu_and_mul(gate, up, "triton"), expected, **TOLERANCE[dtype])


def test_kernels_take_empty_batches():
    empty = torch.empty(0, 16, device=DEVICE)
    assert rms_norm_kernel(empty, torch.ones(16, device=DEVICE), 1e-6)[0].shape == (0, 16)
    assert silu_and_mul_kernel(empty, empty).shape == (0, 16)
    q = torch.empty(0, 2, 16, device=DEVICE)
    table = torch.ones(4, 8, device=DEVICE)
    assert rotary(q, q, torch.empty(0, dtype=torch.long, device=DEVICE), table, table)[0] is q


@cuda_only
def test_kernels_equal_torch_in_bfloat16_at_real_sizes():
    dtype = torch.bfloat16
    x, residual = _rows_view(300, 4096, dtype, 1), _rows_view(300, 4096, dtype, 2)
    weight = _randn(4096, dtype=dtype, seed=3)
    expected, expected_stream = rms_norm(x, weight, 1e-5, residual)
    out, stream = rms_norm_kernel(x, weight, 1e-5, residual)
    assert torch.equal(stream, expected_stream)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    _, q, k, _ = _qkv(300, 32, 8, 128, dtype)
    rope = RotaryEmbedding(128, 8192, dict(LLAMA3_ROPE, rope_theta=500000.0)).to(DEVICE)
    positions = torch.randint(0, 8192, (300,), device=DEVICE)
    expected_q, expected_k = rope(positions, dtype).rotate(q, k)
    rope(positions, dtype, backend="triton").rotate(q, k)
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)
    gate, up = _randn(300, 2 * 14336, dtype=dtype, scale=3.0).split([14336, 14336], dim=-1)
    torch.testing.assert_close(silu_and_mul_kernel(gate, up), silu_and_mul(gate, up),
                               **TOLERANCE[dtype])


# --- torch references against Hugging Face ---------------------------------------------------

BIT_EXACT = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", BIT_EXACT)
def test_rms_norm_equals_llama_rms_norm(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(576, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(576, generator=torch.Generator().manual_seed(9)))
    x, residual = _randn(9, 576, dtype=dtype).cpu(), _randn(9, 576, dtype=dtype, seed=1).cpu()
    out, stream = rms_norm(x, hf.weight, 1e-5)
    assert torch.equal(out, hf(x)) and stream is x
    out, stream = rms_norm(x, hf.weight, 1e-5, residual)
    assert torch.equal(stream, residual + x) and torch.equal(out, hf(residual + x))


@pytest.mark.parametrize("dtype", BIT_EXACT)
@pytest.mark.parametrize("rope", [{}, LLAMA3_ROPE])
def test_rotary_equals_apply_rotary_pos_emb(dtype, rope):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rope_theta=500000.0,
                         rope_scaling=rope or None)
    positions = torch.tensor([0, 3, 64, 200, 511])
    _, q, k, _ = _qkv(5, 4, 2, 32, dtype)
    q, k = q.cpu(), k.cpu()
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(q, positions[None])  # [1, T, dim] in dtype
    hf_q, hf_k = apply_rotary_pos_emb(q[None], k[None], hf_cos, hf_sin, unsqueeze_dim=2)
    ours = RotaryEmbedding(32, 512, rope_parameters(config))(positions, dtype)
    assert torch.equal(ours.cos[:, 0], hf_cos[0]) and torch.equal(ours.signed_sin[:, 0, 16:],
                                                                   hf_sin[0, :, 16:])
    assert torch.equal(apply_rotary(q, ours.cos, ours.signed_sin), hf_q[0])
    assert torch.equal(apply_rotary(k, ours.cos, ours.signed_sin), hf_k[0])


@pytest.mark.parametrize("dtype", BIT_EXACT)
def test_silu_and_mul_equals_act_fn_times_up(dtype):
    from transformers.activations import ACT2FN

    gate, up = _randn(6, 2 * 200, dtype=dtype, scale=4.0).cpu().split([200, 200], dim=-1)
    assert torch.equal(silu_and_mul(gate, up), ACT2FN["silu"](gate) * up)
