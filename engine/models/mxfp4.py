"""MXFP4 weights (OCP microscaling), as OpenAI publishes GPT-OSS's experts: each group of 32
values is 16 bytes of 4-bit E2M1 codes (the low nibble first) and one byte of shared exponent
(2 ** (byte - 127)). The engine dequantizes them at load into the model's dtype, where every
such value is exact, and serves the experts as ordinary weights.

A checkpoint stores a tensor as `NAME_blocks` [..., rows, groups, 16] and `NAME_scales`
[..., rows, groups]; models/prequantized.py turns the pair into `NAME`.
"""

from __future__ import annotations

import torch

from tokenmill.engine.models.source import ModelLoadError

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCKS, SCALES = "_blocks", "_scales"
EXPONENT_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """[..., rows, groups, 16] codes and [..., rows, groups] exponents -> [..., rows,
    groups * 32] values in `dtype`, one leading index at a time (a float32 copy of a whole
    layer's experts would take gigabytes)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ModelLoadError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales "
                         f"{tuple(scales.shape)} (16 bytes per group of 32 values)")
    table = torch.tensor(E2M1, dtype=torch.float32)
    out = torch.empty(*blocks.shape[:-2], blocks.shape[-2] * 32, dtype=dtype)
    flat_blocks = blocks.reshape(-1, *blocks.shape[-3:]) if blocks.dim() > 3 else blocks[None]
    flat_scales = scales.reshape(-1, *scales.shape[-2:]) if scales.dim() > 2 else scales[None]
    flat_out = out.view(-1, *out.shape[-2:]) if out.dim() > 2 else out[None]
    for i in range(flat_blocks.shape[0]):
        codes = flat_blocks[i].long()
        values = torch.stack([table[codes & 0x0F], table[codes >> 4]], dim=-1)
        exponents = flat_scales[i].long() - EXPONENT_BIAS
        values = torch.ldexp(values.flatten(-2), exponents.unsqueeze(-1).float())
        flat_out[i] = values.flatten(-2).to(dtype)
    return out
