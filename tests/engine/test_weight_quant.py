"""Weight quantization (int8, fp8 e4m3; one scale per output channel) of the projections."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.layers import fp8_matmul, quantized_linear
from tokenmill.engine.layers.fp8_matmul import quantize_rows, scaled_mm_supported
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.quantized_linear import (
    CONVERTED_PACK_MAX_ROWS,
    PACK_MAX_ROWS,
    QuantizedLinear,
    QuantizedMergedLinear,
    quantize_linear,
)
from tokenmill.engine.models import quantize as quantize_module
from tokenmill.engine.models.loader import build_model, load_config
from tokenmill.engine.models.quantize import weight_bytes
from tokenmill.engine.models.source import resolve_model

FP8 = torch.float8_e4m3fn
E4M3_HALF_STEP = 2.0 ** -4  # 3 mantissa bits: rounding moves a normal value by <= 1/16 of it
E4M3_HALF_SUBNORMAL = 2.0 ** -10  # below 2^-6 the step is 2^-9 (in units of the scale)


def _linear(in_features: int = 96, out_features: int = 80, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    lin = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0.0, 0.05)
        lin.weight[3] *= 40.0  # an outlier row must not cost the other rows their precision
    return lin


def _dequantized(q: QuantizedLinear) -> torch.Tensor:
    return q.weight.float() * q.weight_scale.float().unsqueeze(1)


@pytest.mark.parametrize("rows", [1, 7, 40])
def test_int8_within_half_a_step_per_weight(rows):
    lin = _linear()
    q = quantize_linear(lin, "int8")
    assert q.weight.dtype == torch.int8 and q.weight_scale.shape == (80,)
    assert q.weight.abs().amax(dim=1).eq(127).all()  # symmetric: each row's amax maps to 127
    x = torch.randn(rows, 96)
    y = q(x)
    # Each weight is off by at most half its row's step, so an output by at most
    # sum_k |x_k| * scale_n / 2 (plus float32 rounding).
    bound = x.abs().sum(dim=1, keepdim=True) * q.weight_scale / 2
    assert ((y - lin(x).detach()).abs() <= bound * 1.001 + 1e-5).all()
    # And it is the matmul with the dequantized weight, to float32 rounding.
    torch.testing.assert_close(y, F.linear(x, _dequantized(q), lin.bias.detach()))


@pytest.mark.parametrize("rows", [1, PACK_MAX_ROWS, PACK_MAX_ROWS + 1, 64])
def test_int8_bfloat16_matches_dequantized_matmul(rows):
    """Small bfloat16 batches run aten._weight_int8pack_mm, larger ones the dequantizing path:
    both equal the dequantized-weight matmul to bfloat16 rounding."""
    q = quantize_linear(_linear(bias=False).to(torch.bfloat16), "int8")
    assert q.weight_scale.dtype == torch.bfloat16
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    assert quantized_linear._packs(x, q.weight, q.compute_dtype) == (rows <= PACK_MAX_ROWS)
    want = F.linear(x.float(), _dequantized(q))
    got = q(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2 ** -6, atol=2 ** -6 * want.abs().max())


@pytest.mark.parametrize("rows", [1, PACK_MAX_ROWS + 1, CONVERTED_PACK_MAX_ROWS,
                                  CONVERTED_PACK_MAX_ROWS + 1, 64])
def test_a_bfloat16_compute_dtype_serves_float32_inputs(rows):
    """A float32 layer with compute dtype bfloat16 (GGUF's Q8_0 kept): up to
    CONVERTED_PACK_MAX_ROWS rows through the int8 kernel in bfloat16, more (large batches, a
    prefill) through the dequantized weight in float32; float32 out either way, each equal to
    the dequantized matmul to its rounding."""
    q = quantize_linear(_linear(bias=True), "int8", compute_dtype=torch.bfloat16)
    assert q.weight_scale.dtype == torch.bfloat16
    x = torch.randn(rows, 96)
    packs = rows <= CONVERTED_PACK_MAX_ROWS
    assert quantized_linear._packs(x, q.weight, q.compute_dtype) == packs
    got = q(x)
    assert got.dtype == torch.float32
    if packs:
        want = F.linear(x.bfloat16().float(), _dequantized(q), q.bias)
        torch.testing.assert_close(got, want, rtol=2 ** -6, atol=2 ** -6 * want.abs().max())
    else:
        torch.testing.assert_close(got, F.linear(x, _dequantized(q), q.bias))


def test_fp8_fallback_within_e4m3_rounding():
    lin = _linear()
    q = quantize_linear(lin, "fp8")
    assert q.weight.dtype == FP8 and not q.scaled_mm  # CPU: the dequantizing fallback
    assert q.weight.float().abs().amax(dim=1).eq(448).all()
    x = torch.randn(9, 96)
    w = lin.weight.detach()
    per_weight = w.abs() * E4M3_HALF_STEP + q.weight_scale.unsqueeze(1) * E4M3_HALF_SUBNORMAL
    assert ((_dequantized(q) - w).abs() <= per_weight * 1.001).all()
    bound = x.abs() @ per_weight.t()
    y = q(x)
    assert ((y - lin(x).detach()).abs() <= bound * 1.001 + 1e-5).all()
    torch.testing.assert_close(y, F.linear(x, _dequantized(q), lin.bias.detach()))


def test_float16_fallback_does_not_overflow():
    """Unscaled products of large float16 activations with |q| up to 448 would pass 65504."""
    lin = _linear(bias=False)
    q = quantize_linear(lin.to(torch.float16), "fp8")
    x = torch.full((2, 96), 300.0, dtype=torch.float16)
    want = F.linear(x.float(), _dequantized(q))
    assert want.abs().max() < 65504
    torch.testing.assert_close(q(x).float(), want, rtol=2 ** -9, atol=1.0)


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_merged_parts_split_like_separate_layers(method):
    """Scales are per row, so quantizing the merged weight equals quantizing each part."""
    torch.manual_seed(1)
    merged = MergedLinear(64, {"q_proj": 64, "k_proj": 32, "v_proj": 32}, bias=True)
    q = quantize_linear(merged, method)
    assert isinstance(q, QuantizedMergedLinear)
    x = torch.randn(5, 64)
    parts = q(x)
    assert [p.shape for p in parts] == [(5, 64), (5, 32), (5, 32)]
    views = merged.part_tensors()
    for name, got in zip(merged.parts, parts, strict=True):
        alone = nn.Linear(64, got.shape[-1])
        with torch.no_grad():
            alone.weight.copy_(views[f"{name}.weight"])
            alone.bias.copy_(views[f"{name}.bias"])
        torch.testing.assert_close(got, quantize_linear(alone, method)(x), rtol=0, atol=0)


def test_bias_kept_unquantized():
    lin = _linear()
    q = quantize_linear(lin, "int8")
    assert q.bias.dtype == torch.float32 and torch.equal(q.bias, lin.bias.detach())
    assert torch.equal(q(torch.zeros(3, 96)), lin.bias.detach().expand(3, -1))
    assert quantize_linear(_linear(bias=False), "int8").bias is None


def test_leading_dims_kept():
    q = quantize_linear(_linear(), "int8")
    x = torch.randn(2, 3, 96)
    torch.testing.assert_close(q(x), q(x.reshape(6, 96)).reshape(2, 3, 80))


def test_activation_rows_quantized_to_fp8_with_row_scales():
    x = torch.randn(6, 48)
    x[2] *= 1000.0  # an outlier token keeps its own scale
    x[4] = 0.0
    values, scales = quantize_rows(x)
    assert values.dtype == FP8 and scales.shape == (6, 1) and scales.dtype == torch.float32
    assert values.float().abs().amax(dim=1)[[0, 1, 2, 3, 5]].eq(448).all()
    back = values.float() * scales
    assert torch.equal(back[4], torch.zeros(48))
    bound = x.abs() * E4M3_HALF_STEP + scales * E4M3_HALF_SUBNORMAL
    assert ((back - x).abs() <= bound * 1.001).all()


def test_scaled_mm_path_on_cpu(monkeypatch):
    """torch._scaled_mm also runs on CPU: the tensor-core path's layout (column-major weight),
    float32 scales and bias handling, checked against the matmul of the dequantized operands."""
    monkeypatch.setattr(quantized_linear, "scaled_mm_supported", lambda *args: True)
    lin = _linear().to(torch.bfloat16)
    q = quantize_linear(lin, "fp8")
    assert q.scaled_mm and q.weight_scale.dtype == torch.float32
    x = torch.randn(2, 5, 96, dtype=torch.bfloat16)
    values, scales = quantize_rows(x.reshape(10, 96))
    want = (values.float() * scales) @ _dequantized(q).t() + lin.bias.detach().float()
    got = q(x)
    assert got.shape == (2, 5, 80) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.reshape(10, 80).float(), want, rtol=2 ** -6,
                               atol=2 ** -6 * want.abs().max())


def test_scaled_mm_only_where_it_can_run():
    cuda = torch.device("cuda")
    # Decided before any CUDA call: a wrong dtype or a dimension that is not a multiple of 16.
    assert not scaled_mm_supported(cuda, torch.float32, 64, 64)
    assert not scaled_mm_supported(cuda, torch.bfloat16, 72, 64)
    assert not scaled_mm_supported(cuda, torch.bfloat16, 64, 40)
    assert not scaled_mm_supported(torch.device("cpu"), torch.bfloat16, 64, 64)
    assert fp8_matmul.MIN_CAPABILITY == (8, 9)


@pytest.fixture(scope="module")
def tiny_source(tiny_llama_dir):
    source = resolve_model(tiny_llama_dir)
    return source, load_config(source)


def _build(tiny_source, dtype=torch.float32, quantization=None):
    source, config = tiny_source
    return build_model(config, source, 64, dtype, torch.device("cpu"), show_progress=False,
                       quantization=quantization)


def _projections(model) -> list[nn.Module]:
    return [m for layer in model.model.layers
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                      layer.mlp.gate_up_proj, layer.mlp.down_proj)]


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_only_projections_quantized(tiny_source, method):
    model = _build(tiny_source, quantization=method)
    assert all(isinstance(m, QuantizedLinear) for m in _projections(model))
    assert isinstance(model.model.layers[0].mlp.gate_up_proj, QuantizedMergedLinear)
    quantized = {n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert len(quantized) == 4 * len(model.model.layers)
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == torch.float32
    assert not any(isinstance(m, nn.Linear) for m in model.model.layers.modules())


def test_full_precision_weights_released(tiny_source):
    model = _build(tiny_source)
    refs = [weakref.ref(m.weight) for m in _projections(model)]
    quantize_module.quantize_model(model, "int8")
    assert all(r() is None for r in refs)


def _linear_bytes(model, weight_size: int, scale_size: int) -> int:
    """Bytes of the projections' weights at weight_size per value plus one scale a row."""
    return sum(m.out_features * (m.in_features * weight_size + scale_size)
               for m in _projections(model))


@pytest.mark.parametrize(("dtype", "size", "ratio"), [(torch.float32, 4, 0.25),
                                                      (torch.bfloat16, 2, 0.5)])
def test_weight_bytes_shrink(tiny_source, dtype, size, ratio):
    full = _build(tiny_source, dtype)
    int8 = _build(tiny_source, dtype, "int8")
    # Only the projections change: their values to one byte, plus a scale per output row.
    linear_full = sum(m.weight.nbytes for m in _projections(full))
    saved = linear_full - _linear_bytes(int8, 1, size)
    assert weight_bytes(full) - weight_bytes(int8) == saved
    # The decoder layers (projections and norms) shrink ~4x from float32, ~2x from bfloat16;
    # the embeddings and LM head, unquantized, dominate this tiny model's total.
    layers = weight_bytes(int8.model.layers) / weight_bytes(full.model.layers)
    assert ratio < layers < ratio * 1.1
    head = full.lm_head.weight.nbytes
    assert weight_bytes(full) == weight_bytes(full.model) + head  # not tied in this model


def test_fp8_refused_without_float8_dtypes(monkeypatch, tiny_llama_dir):
    monkeypatch.setattr(quantize_module, "FP8_DTYPE", None)
    with pytest.raises(ConfigError) as err:
        LLM(tiny_llama_dir, quantization="fp8", show_progress=False)
    assert err.value.option == "quantization"


@pytest.fixture(scope="module")
def reference_steps(tiny_llama):
    """Prompts extended by the unquantized engine's greedy continuation, one step at a time,
    and the token it chose after each."""
    tokenizer = tiny_llama.tokenizer
    texts = ["Hello, my name is", "The capital of France is", "def quicksort(arr):",
             "A list of prime numbers: 2, 3, 5, 7,", "Once upon a time", "import numpy as np\n"]
    prompts = [tokenizer.encode(t) for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = [o.outputs[0].token_ids for o in tiny_llama.generate(prompts, params)]
    steps = [p + out[:i] for p, out in zip(prompts, outputs, strict=True) for i in range(12)]
    return steps, [t for out in outputs for t in out]


@pytest.mark.parametrize(("method", "min_agreement"), [("int8", 0.9), ("fp8", 0.75)])
def test_engine_greedy_top1_agrees(tiny_llama_dir, reference_steps, method, min_agreement):
    """Greedy decoding with quantized weights, compared position by position along the
    unquantized engine's own continuation (top-1 agreement), so one early flip does not
    count against every later token. A random-weight model has small top-1 margins over its
    49k-token vocabulary, so some positions flip: measured 0.94 for int8 (error per weight at
    most half of amax/127) and 0.85 for fp8 (3 mantissa bits, up to 1/16 of each weight)."""
    llm = LLM(tiny_llama_dir, quantization=method, show_progress=False,
              kv_cache_memory=64 << 20)
    steps, want = reference_steps
    free = llm.generate(steps[:2], SamplingParams(temperature=0.0, max_tokens=12,
                                                  ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 12 for o in free)
    got = [o.outputs[0].token_ids[0]
           for o in llm.generate(steps, SamplingParams(temperature=0.0, max_tokens=1))]
    agreement = sum(a == b for a, b in zip(got, want, strict=True)) / len(want)
    assert agreement >= min_agreement
