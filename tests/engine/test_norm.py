"""The torch RMSNorm (the CPU path) against Hugging Face's LlamaRMSNorm, bit for bit: float32
takes one fused op, other dtypes the reference's own steps."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine.layers.norm import rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 576), (3, 64), (17, 4096), (5, 100), (4, 8, 128)])
def test_rms_norm_equals_llama_rms_norm_bit_for_bit(dtype, shape):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(sum(shape))
    reference = LlamaRMSNorm(shape[-1], eps=1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(shape[-1]))
    x = (torch.randn(shape) * 3).to(dtype)
    residual = torch.randn(shape).to(dtype)
    with torch.no_grad():
        out, stream = rms_norm(x, reference.weight, 1e-5)
        assert torch.equal(out, reference(x)) and stream is x
        out, stream = rms_norm(x, reference.weight, 1e-5, residual)
        assert torch.equal(stream, x + residual)
        assert torch.equal(out, reference(x + residual))
