"""fp8 e4m3 matmul on tensor cores: `torch._scaled_mm` with row-wise scales.

Activations are quantized on the fly with one scale per row (token), so one outlier token does
not cost the others their precision; weights carry one scale per output channel. `_scaled_mm`
wants the first operand row-major and the second column-major (the [N, K] row-major weight,
transposed, is), K and N multiples of 16, and float32 scales shaped [M, 1] and [1, N]. fp8
tensor cores start at compute capability 8.9 (Ada, Hopper); elsewhere the weights are
dequantized instead (quantized_linear.py).

Up to WEIGHT_ONLY_ROWS rows (decode batches) the activations stay as they are and the fp8
weights are read by a Triton matrix-vector kernel (kernels/weight_only_matmul.py): a step there
is the weights' bytes over the bandwidth, which `_scaled_mm`'s tiles for many rows do not
reach at one row.
"""

from __future__ import annotations

import functools

import torch

from tokenmill.engine.layers.kv_quant import qmax, quantize

FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
MIN_CAPABILITY = (8, 9)
ALIGNMENT = 16
WEIGHT_ONLY_ROWS = 16


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 values [M, K], float32 scales [M, 1]) with x ~= values * scales; on
    CUDA in one Triton launch (kernels/quantize_rows.py), elsewhere through torch."""
    if x.is_cuda and x.dim() == 2:
        from tokenmill.engine.kernels.quantize_rows import quantize_rows as fused

        values, scales = fused(x, FP8_DTYPE, qmax(FP8_DTYPE))
    else:
        values, scales = quantize(x, FP8_DTYPE)
    return values, scales.unsqueeze(1)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] fp8 * weight_scale [N] float32)^T, in x's dtype."""
    if x.is_cuda and x.dim() == 2 and x.shape[0] <= WEIGHT_ONLY_ROWS:
        from tokenmill.engine.kernels.weight_only_matmul import weight_only_matmul

        return weight_only_matmul(x, weight, weight_scale)
    values, scales = quantize_rows(x)
    return torch._scaled_mm(values, weight.t(), scale_a=scales,
                            scale_b=weight_scale.view(1, -1), out_dtype=x.dtype)


def scaled_mm_supported(device: torch.device, dtype: torch.dtype, in_features: int,
                        out_features: int) -> bool:
    """Whether fp8_linear runs for these shapes and this output dtype on this device."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    if in_features % ALIGNMENT or out_features % ALIGNMENT:
        return False
    return _runs_on(device.index or 0, dtype)


@functools.cache
def _runs_on(device_index: int, dtype: torch.dtype) -> bool:
    """One tiny call: row-wise scaling and its output dtypes vary with the GPU and the torch
    and cuBLAS versions, and a failure at load time is better than one mid-request."""
    device = torch.device("cuda", device_index)
    if torch.cuda.get_device_capability(device) < MIN_CAPABILITY:
        return False
    weight = torch.ones(ALIGNMENT, ALIGNMENT, device=device).to(FP8_DTYPE)
    scale = torch.ones(ALIGNMENT, device=device)
    for rows in (1, WEIGHT_ONLY_ROWS + 1):  # the decode kernel, then _scaled_mm
        x = torch.ones(rows, ALIGNMENT, device=device, dtype=dtype)
        try:
            out = fp8_linear(x, weight, scale)
        except (RuntimeError, ValueError, NotImplementedError):
            return False
        if not torch.allclose(out.float(), torch.full_like(out.float(), ALIGNMENT), rtol=1e-2):
            return False
    return True
