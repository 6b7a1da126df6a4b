"""The torch RMSNorm (the CPU path) against Hugging Face's LlamaRMSNorm and GemmaRMSNorm, bit for
bit: float32 takes one fused op, other dtypes the reference's own steps."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine.layers.norm import rms_norm


def _llama_norm(size: int, eps: float):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm(size, eps=eps)


def _gemma_norm(size: int, eps: float):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    return GemmaRMSNorm(size, eps=eps)


# (reference norm, unit_offset): Gemma's norm (Gemma 1, 2 and 3; Gemma 3's over each head of
# q and k too) scales by 1 + weight in float32 and rounds after.
NORMS = [(_llama_norm, False), (_gemma_norm, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 576), (3, 64), (17, 4096), (5, 100), (4, 8, 128)])
@pytest.mark.parametrize("norm,unit_offset", NORMS)
def test_rms_norm_equals_the_reference_norm_bit_for_bit(dtype, shape, norm, unit_offset):
    torch.manual_seed(sum(shape))
    reference = norm(shape[-1], 1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(shape[-1]))
    x = (torch.randn(shape) * 3).to(dtype)
    residual = torch.randn(shape).to(dtype)
    with torch.no_grad():
        out, stream = rms_norm(x, reference.weight, 1e-5, unit_offset=unit_offset)
        assert torch.equal(out, reference(x)) and stream is x
        out, stream = rms_norm(x, reference.weight, 1e-5, residual, unit_offset=unit_offset)
        assert torch.equal(stream, x + residual)
        assert torch.equal(out, reference(x + residual))
