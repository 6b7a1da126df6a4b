"""Per-row dynamic quantization in one launch: each row's largest magnitude sets its scale
(amax / limit, 1 for an all-zero row), and the row is divided by it, clamped to ±limit and cast.

The torch reference is `layers/kv_quant.quantize`, which takes about nine elementwise launches
(cast, abs, max, divide, where, divide, clamp, cast); an fp8 linear quantizes its activations
before every matmul, so at one row a step of a 32-layer model launched over a thousand of them.
Both divisions are rounded to nearest (`div_rn`), as torch divides one tensor by another:
Triton's `/` compiles to an approximate division on NVIDIA GPUs, which lands some values on
the other side of an fp8 rounding boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK = 4096  # columns a program holds at once; wider rows take two passes over memory


@triton.jit
def _quantize_rows_kernel(
    x_ptr, out_ptr, scale_ptr, stride_x, stride_o, width, limit,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    top = tl.zeros([BLOCK], tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < width, other=0.0).to(tl.float32)
        top = tl.maximum(top, tl.abs(x))
    amax = tl.max(top, 0)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, limit), 1.0)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -limit), limit)
        tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows(x: torch.Tensor, dtype: torch.dtype,
                  limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, width] -> (values [rows, width] in dtype, float32 scales [rows])."""
    rows, width = x.shape
    values = torch.empty(rows, width, dtype=dtype, device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0:
        return values, scales
    if x.stride(1) != 1:
        x = x.contiguous()
    _quantize_rows_kernel[(rows,)](
        x, values, scales, x.stride(0), values.stride(0), width, limit,
        BLOCK=min(MAX_BLOCK, triton.next_power_of_2(width)),
    )
    return values, scales
