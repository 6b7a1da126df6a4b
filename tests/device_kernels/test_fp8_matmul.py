"""fp8 matmuls on tensor cores (`torch._scaled_mm`) at a real model's sizes: chosen where the
GPU has them, and equal to the matmul of the dequantized operands. They need a GPU of compute
capability 8.9+; on the CPU, tests/engine/test_weight_quant.py checks the same path's layout
through torch's CPU `_scaled_mm`."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from triton_support import DEVICE, FP8_GPU

from tokenmill.engine.layers.fp8_matmul import quantize_rows
from tokenmill.engine.layers.quantized_linear import quantize_linear

fp8_tensor_cores = pytest.mark.skipif(
    not FP8_GPU, reason="fp8 matmuls need a GPU of compute capability 8.9+")


@fp8_tensor_cores
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_scaled_mm_equals_the_dequantized_matmul_at_real_sizes(rows):
    torch.manual_seed(0)
    # Llama-3.1-8B's fused QKV projection: 4096 in, 4096 + 2 * 1024 out.
    linear = nn.Linear(4096, 6144, bias=False, device=DEVICE, dtype=torch.bfloat16)
    quantized = quantize_linear(linear, "fp8")
    assert quantized.scaled_mm and quantized.weight_scale.dtype == torch.float32
    x = torch.randn(rows, 4096, device=DEVICE, dtype=torch.bfloat16)
    values, scales = quantize_rows(x)
    weight = quantized.weight.float() * quantized.weight_scale.unsqueeze(1)
    want = (values.float() * scales) @ weight.t()
    got = quantized(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2 ** -6, atol=2 ** -6 * want.abs().max())
