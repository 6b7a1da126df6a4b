"""Quantized KV storage: int8, fp8 e4m3 or fp8 e5m2 values with one float32 scale per (token,
K/V head).

Symmetric, per row of head_dim values: scale = amax(|x|) / qmax, stored = x / scale rounded into
the storage type (qmax 127 for int8, 448 for e4m3, 57344 for e5m2), read back as stored *
scale. A zero row gets scale 1 so it reads back as zeros. This is the oracle of the Triton
kv_write kernel.
"""

from __future__ import annotations

import torch

KV_STORAGE_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn,
                     "fp8_e5m2": torch.float8_e5m2}


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the pool's K/V values for the kv_cache_dtype option (auto: the model's)."""
    return model_dtype if kv_cache_dtype == "auto" else KV_STORAGE_DTYPES[kv_cache_dtype]


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in KV_STORAGE_DTYPES.values()


def qmax(dtype: torch.dtype) -> float:
    """The largest magnitude a quantized value may take (127 for int8, 448 for e4m3, 57344 for
    e5m2)."""
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return float(info.max)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., dim] -> (values [..., dim] in dtype, scales [...] float32).

    int8 rounds half away from zero, the rounding the Triton kernel does too, so both store the
    same codes; fp8 rounds to nearest even in the cast, as the GPU's conversion does.
    """
    limit = qmax(dtype)
    x = x.float()
    amax = x.abs().amax(dim=-1)
    # By a tensor, not a number: CUDA divides by a number as a product with its reciprocal,
    # which can differ from the division in the last bit.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, limit), torch.ones_like(amax))
    y = x / scale.unsqueeze(-1)
    if not dtype.is_floating_point:
        y = torch.sign(y) * torch.floor(y.abs() + 0.5)
    return y.clamp(-limit, limit).to(dtype), scale


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., dim] times their scales [...], computed in float32, returned in dtype."""
    return (values.float() * scales.unsqueeze(-1)).to(dtype)
