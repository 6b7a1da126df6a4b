"""Linear layers whose weights are stored int8 or fp8 e4m3, one scale per output channel.

Weight-only quantization (W8A16): activations stay in the model dtype, except on the fp8
tensor-core path, which quantizes them per row on the fly. Symmetric per output channel:
scale = amax(|row|) / qmax (127 for int8, 448 for e4m3), so one large row does not cost the
others their precision and the matmul can apply the scale to its output columns.

The kernel is picked per call, from what measured fastest on CPU and what the GPU offers:
- int8, CPU, bfloat16 activations, at most PACK_MAX_ROWS rows (decode): aten's
  `_weight_int8pack_mm` reads the int8 weight directly. Its float32 and float16 paths, and
  larger batches in bfloat16, are slower than the fallback below on the machine that set
  PACK_MAX_ROWS. A layer given a bfloat16 `compute_dtype` (GGUF's Q8_0 kept in a float32
  model) converts its activations to bfloat16 for this kernel only, up to
  CONVERTED_PACK_MAX_ROWS rows; its fallback runs in the model dtype (float32), where
  converting the whole weight per call beats the kernel's cost per row from a few dozen rows
  (larger decode batches, a prefill).
- fp8 on CUDA with compute capability 8.9 or higher: fp8_matmul.fp8_linear (`_scaled_mm`).
- otherwise: the weight converted to the activation dtype, F.linear, then the output scaled
  per channel (cheaper than scaling the weight: N multiplies per row instead of N * K).
  torch converts fp8 to float without vectorized code on CPU (about 50x the cost of int8's
  conversion), so on CPU int8 is the fast choice and fp8 a correctness path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.layers.fp8_matmul import FP8_DTYPE, fp8_linear, scaled_mm_supported
from tokenmill.engine.layers.kv_quant import quantize
from tokenmill.engine.layers.linear import MergedLinear, SplitParts, linear_output

WEIGHT_DTYPES = {"int8": torch.int8, "fp8": FP8_DTYPE}
PACK_MAX_ROWS = 12
CONVERTED_PACK_MAX_ROWS = 32


def dequantized_linear(x: torch.Tensor, weight: torch.Tensor,
                       scale: torch.Tensor) -> torch.Tensor:
    """x @ (weight * scale[:, None])^T in x's dtype, for any device and weight storage."""
    scale = scale.to(x.dtype)
    if x.dtype == torch.float16:
        # Unscaled products (|weight| up to 127 or 448) would overflow float16's 65504 for
        # large activations: scale the weight first.
        return F.linear(x, weight.to(x.dtype) * scale.unsqueeze(1))
    return F.linear(x, weight.to(x.dtype)) * scale


def _packs(rows: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype) -> bool:
    """Whether these rows (in the model dtype) go through `_weight_int8pack_mm`."""
    if weight.dtype != torch.int8 or rows.device.type != "cpu" or compute_dtype != torch.bfloat16:
        return False
    limit = PACK_MAX_ROWS if rows.dtype == compute_dtype else CONVERTED_PACK_MAX_ROWS
    return rows.shape[0] <= limit


class QuantizedLinear(nn.Module):
    """y = x W^T + b with W = weight * weight_scale[:, None]; the bias stays unquantized."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype, compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # The matmul's activation dtype; outputs return to the input's (see quantize_linear).
        self.compute_dtype = compute_dtype or dtype
        dtype = self.compute_dtype
        # _scaled_mm takes float32 scales; the other kernels want them in the activation dtype.
        self.scaled_mm = weight.dtype == FP8_DTYPE and scaled_mm_supported(
            weight.device, dtype, self.in_features, self.out_features)
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale.float() if self.scaled_mm else scale.to(dtype))
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.scaled_mm:
            y = fp8_linear(rows.to(self.compute_dtype), self.weight, self.weight_scale)
        elif _packs(rows, self.weight, self.compute_dtype):
            y = torch.ops.aten._weight_int8pack_mm(rows.to(self.compute_dtype).contiguous(),
                                                   self.weight, self.weight_scale)
        else:
            y = dequantized_linear(rows, self.weight, self.weight_scale)
        return linear_output(y, x, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"weight={self.weight.dtype}, scaled_mm={self.scaled_mm}")


class QuantizedMergedLinear(SplitParts, QuantizedLinear):
    """MergedLinear quantized: one matmul, its output split into the declared parts."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype, parts: dict[str, int],
                 compute_dtype: torch.dtype | None = None):
        super().__init__(weight, scale, bias, dtype, compute_dtype)
        self.parts = dict(parts)


def quantize_linear(linear: nn.Linear, method: str,
                    compute_dtype: torch.dtype | None = None) -> QuantizedLinear:
    """The quantized twin of `linear` (a MergedLinear keeps its parts) on the same device.
    `compute_dtype`, where given, is the activations' dtype inside the matmul: bfloat16 lets
    float32 models use the CPU's int8 kernel, which is fast only in bfloat16."""
    with torch.no_grad():
        weight, scale = quantize(linear.weight, WEIGHT_DTYPES[method])
        bias = None if linear.bias is None else linear.bias.detach()
    dtype = linear.weight.dtype
    if isinstance(linear, MergedLinear):
        return QuantizedMergedLinear(weight, scale, bias, dtype, linear.parts, compute_dtype)
    return QuantizedLinear(weight, scale, bias, dtype, compute_dtype)
