"""fp8 matmuls on tensor cores (`torch._scaled_mm`) at a real model's sizes: chosen where the
GPU has them, and equal to the matmul of the dequantized operands. They need a GPU of compute
capability 8.9+; on the CPU, tests/engine/test_weight_quant.py checks the same path's layout
through torch's CPU `_scaled_mm`."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from triton_support import DEVICE, FP8_GPU

from tokenmill.engine.kernels import launch_configs
from tokenmill.engine.kernels import quantize_rows as kernel
from tokenmill.engine.kernels.weight_only_matmul import weight_only_matmul
from tokenmill.engine.layers.fp8_matmul import FP8_DTYPE, WEIGHT_ONLY_ROWS, quantize_rows
from tokenmill.engine.layers.kv_quant import qmax, quantize
from tokenmill.engine.layers.quantized_linear import quantize_linear

fp8_tensor_cores = pytest.mark.skipif(
    not FP8_GPU, reason="fp8 matmuls need a GPU of compute capability 8.9+")


@pytest.mark.parametrize("width", [64, 5000, 14336])
def test_the_row_quantization_kernel_scales_divides_and_clamps_as_torch(width):
    """Each row's scale and its divided, clamped values, in float16 (whose cast rounds the
    same on the CPU interpreter and a GPU; fp8's cast is checked on a GPU below). 5000 and
    14336 columns take more than one block per pass."""
    torch.manual_seed(width)
    wide = torch.randn(4, width + 3, device=DEVICE, dtype=torch.bfloat16) * 5
    wide[2] = 0  # an all-zero row keeps scale 1
    x = wide[:, 1:width + 1]  # a row stride that is not the width
    values, scales = kernel.quantize_rows(x, torch.float16, 448.0)
    ref = x.float()
    amax = ref.abs().amax(dim=1)
    want_scales = torch.where(amax > 0, amax / torch.full_like(amax, 448.0),
                              torch.ones_like(amax))
    assert torch.equal(scales, want_scales)
    want = (ref / want_scales.unsqueeze(1)).clamp(-448.0, 448.0).to(torch.float16)
    assert torch.equal(values, want)
    empty_values, empty_scales = kernel.quantize_rows(x[:0], torch.float16, 448.0)
    assert empty_values.shape == (0, width) and empty_scales.shape == (0,)


@fp8_tensor_cores
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_fp8_rows_from_the_kernel_equal_torchs_quantization(rows):
    x = torch.randn(rows, 4096, device=DEVICE, dtype=torch.bfloat16) * 3
    values, scales = quantize_rows(x)  # the kernel, on CUDA
    want_values, want_scales = quantize(x, FP8_DTYPE)
    assert torch.equal(scales.squeeze(1), want_scales)
    assert torch.equal(values.float(), want_values.float())
    assert qmax(FP8_DTYPE) == 448.0


@fp8_tensor_cores
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 300])
def test_fp8_linear_equals_the_dequantized_matmul_at_real_sizes(rows):
    """Up to WEIGHT_ONLY_ROWS rows the activations stay unquantized (the decode kernel), past
    it they are quantized per row for `_scaled_mm`."""
    torch.manual_seed(0)
    # Llama-3.1-8B's fused QKV projection: 4096 in, 4096 + 2 * 1024 out.
    linear = nn.Linear(4096, 6144, bias=False, device=DEVICE, dtype=torch.bfloat16)
    quantized = quantize_linear(linear, "fp8")
    assert quantized.scaled_mm and quantized.weight_scale.dtype == torch.float32
    x = torch.randn(rows, 4096, device=DEVICE, dtype=torch.bfloat16)
    values, scales = quantize_rows(x)
    weight = quantized.weight.float() * quantized.weight_scale.unsqueeze(1)
    rows_in = x.float() if rows <= WEIGHT_ONLY_ROWS else values.float() * scales
    want = rows_in @ weight.t()
    got = quantized(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2 ** -6, atol=2 ** -6 * want.abs().max())


SETTINGS = [
    {},
    {"split_k": 3, "block_k": 64},                    # three shares of the inner dimension
    {"split_k": 8, "block_k": 128, "block_n": 32},    # fewer shares than asked: 300 / 128
    {"rowwise": True, "block_n": 8, "block_k": 128},  # one row per program, no tl.dot
    {"rowwise": True, "split_k": 2, "block_n": 16, "block_k": 64},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in
                                                                       s.items()) or "defaults")
@pytest.mark.parametrize("rows", [1, 5, 16, 20])
def test_the_weight_only_kernel_equals_the_scaled_matmul(rows, settings):
    """Rows of activations times stored weights and per-channel scales: one and several rows,
    a second block of rows past 16, channels and an inner size that fill no block, and rows
    with a stride other than their width. float32 activations over float16 weights, which the
    CPU interpreter multiplies as a GPU does (fp8 weights are checked on a GPU above)."""
    torch.manual_seed(rows)
    wide = torch.randn(rows, 303, device=DEVICE)
    x = wide[:, :300]
    weight = (torch.randn(40, 300, device=DEVICE) * 2).to(torch.float16)
    scale = torch.rand(40, device=DEVICE) + 0.5
    got = weight_only_matmul(x, weight, scale, **settings)
    want = x @ (weight.float() * scale.unsqueeze(1)).t()
    assert got.shape == (rows, 40) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert weight_only_matmul(x[:0], weight, scale, **settings).shape == (0, 40)


def test_split_sums_do_not_vary_between_runs():
    """The shares' partial sums are added in one fixed order (no atomics)."""
    torch.manual_seed(1)
    x = torch.randn(2, 1000, device=DEVICE)
    weight = torch.randn(16, 1000, device=DEVICE).to(torch.float16)
    scale = torch.rand(16, device=DEVICE) + 0.5
    first = weight_only_matmul(x, weight, scale, split_k=4, block_k=64)
    assert torch.equal(weight_only_matmul(x, weight, scale, split_k=4, block_k=64), first)


def test_the_kernel_launches_with_the_devices_measured_settings(tmp_path, monkeypatch):
    """A launch-config file's entry for the shape is what the kernel runs with: a setting no
    kernel can take (a 3-wide tile) fails the launch, the same shape's other row count and
    other shapes keep the defaults."""
    torch.manual_seed(2)
    x = torch.randn(1, 64, device=DEVICE)
    weight = torch.randn(32, 64, device=DEVICE).to(torch.float16)
    scale = torch.ones(32, device=DEVICE)
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"weight_only_matmul": {"32x64:m1": {"block_n": 3}}}))
    monkeypatch.setenv(launch_configs.ENV_VAR, str(path))
    launch_configs.clear_cache()
    try:
        with pytest.raises(Exception, match="power of 2|arange"):
            weight_only_matmul(x, weight, scale)
        want = x.repeat(2, 1) @ weight.float().t()
        torch.testing.assert_close(weight_only_matmul(x.repeat(2, 1), weight, scale), want)
        path.write_text(json.dumps({"weight_only_matmul": {"32x64:m1": {
            "rowwise": True, "block_n": 8, "block_k": 32, "split_k": 2}}}))
        launch_configs.clear_cache()
        torch.testing.assert_close(weight_only_matmul(x, weight, scale), x @ weight.float().t())
    finally:
        launch_configs.clear_cache()
