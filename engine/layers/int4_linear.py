"""Linear layers whose weights are 4-bit integers in groups of 32 along the input, each group
with its own scale and offset: w = (q - 8) * scale + zero, q in 0..15.

That is GGUF's Q4_0 (zero = 0) and Q4_1 (w = q * d + m, so zero = m + 8 d) exactly, so a
GGUF file's 4-bit tensors are kept as they are stored instead of being dequantized at load.
The matmul is aten's CPU weight-only int4 kernel, `_weight_int4pack_mm_for_cpu`, which reads
the packed nibbles directly: a decode step reads about a seventh of the float32 weights' bytes.
The kernel is fast with bfloat16 activations only (its float32 path is several times slower
than float32 F.linear), so activations are converted to bfloat16 for the matmul and its output
back to the model dtype; scales and offsets are kept in bfloat16, as the kernel takes them.

The kernel's cost grows with the rows like a plain matmul's, at about twice its time per row,
so from DEQUANTIZE_FROM_ROWS rows (a prefill) the layer unpacks its codes into a float32
weight for that call and runs F.linear in float32: unpacking costs about as much as the kernel
on a few dozen rows, and a long prompt's first token comes sooner (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.layers.linear import SplitParts, linear_output

GROUP_SIZE = 32
COMPUTE_DTYPE = torch.bfloat16
INNER_K_TILES = 4  # the CPU packing's tile width (2, 4 or 8); 4 measured fastest at 1 and 8 rows
DEQUANTIZE_FROM_ROWS = 64  # rows from which unpacking to a float weight beats the kernel
# The CPU packing by the kernel build torch picked for this CPU, as (output rows per block,
# halves): blocks of 64 (AVX512) or 32 (AVX2) rows whose first and second halves share bytes,
# or blocks of 32 whose consecutive rows pair up (the portable build). See unpack_codes.
PACKINGS = ((64, True), (32, True), (32, False))


def int4_supported(device: torch.device) -> bool:
    """Whether this torch build runs the int4 weight-only matmul on `device` (CPU only)."""
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


@dataclass
class Int4Weight:
    """A weight [N, K] as 4-bit codes with one scale and offset per group of 32 inputs."""

    codes: torch.Tensor  # [N, K] uint8, values 0..15
    scale: torch.Tensor  # [N, K / 32] float32
    zero: torch.Tensor   # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these codes stand for."""
        groups = self.codes.float().unflatten(1, (-1, GROUP_SIZE)) - 8
        return (groups * self.scale.unsqueeze(2) + self.zero.unsqueeze(2)).flatten(1)

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """The parts stacked along the output rows (a merged projection)."""
        return Int4Weight(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                          torch.cat([p.zero for p in parts]))


def unpack_codes(packed: torch.Tensor, out_features: int, in_features: int,
                 packing: tuple[int, bool] | None = None) -> torch.Tensor:
    """The [N, K] codes of `_convert_weight_to_int4pack_for_cpu`'s output, in float32, read
    with `packing` (default: this CPU's, `kernel_packing()`). The packing stores blocks of
    output rows; in a block, input k takes a byte per two rows: with halves, row j of the first
    half in the low nibble and row j of the second half in the high one; without, rows 2j and
    2j + 1. The rows after the last whole block form a last block, always paired. (The layout
    is the kernel's own: `kernel_packing` checks it against this torch.)"""
    block, halves = packing or kernel_packing()
    flat = packed.flatten()
    out = torch.empty(out_features, in_features)
    whole = out_features - out_features % block
    if whole:
        codes = flat[:whole * in_features // 2].view(-1, in_features, block // 2).transpose(1, 2)
        _split_nibbles(codes, out[:whole].view(-1, block, in_features), halves)
    if whole < out_features:
        rest = out_features - whole
        codes = flat[whole * in_features // 2:].view(1, in_features, rest // 2).transpose(1, 2)
        _split_nibbles(codes, out[whole:].view(1, rest, in_features), halves=False)
    return out


def _split_nibbles(codes: torch.Tensor, rows: torch.Tensor, halves: bool) -> None:
    """Bytes [blocks, B / 2, K] into the rows [blocks, B, K] their nibbles hold."""
    if halves:
        low, high = rows.chunk(2, dim=1)
    else:
        pairs = rows.unflatten(1, (-1, 2))
        low, high = pairs[:, :, 0], pairs[:, :, 1]
    torch.bitwise_and(codes, 15, out=low)
    torch.bitwise_right_shift(codes, 4, out=high)


@functools.cache
def kernel_packing() -> tuple[int, bool] | None:
    """The entry of PACKINGS that reads this torch's packing back exactly, found once per
    process on random codes of whole blocks and a partial one; None when none does (the float
    path is then off)."""
    seeded = torch.Generator().manual_seed(0)
    for packing in PACKINGS:
        codes = torch.randint(0, 16, (2 * packing[0] + 16, 4 * GROUP_SIZE), dtype=torch.int32,
                              generator=seeded)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES)
        try:
            if torch.equal(unpack_codes(packed, *codes.shape, packing).to(torch.int32), codes):
                return packing
        except RuntimeError:  # another packed shape
            continue
    return None


def quantize_int4(weight: torch.Tensor) -> Int4Weight:
    """Asymmetric 4-bit codes of a float weight [N, K] (K a multiple of 32): each group spans
    its own minimum to maximum in 15 steps (GGUF's Q4_1 rule)."""
    groups = weight.detach().float().unflatten(1, (-1, GROUP_SIZE))
    low, high = groups.amin(2), groups.amax(2)
    scale = (high - low) / 15
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((groups - low.unsqueeze(2)) / safe.unsqueeze(2)).round().clamp(0, 15)
    return Int4Weight(codes.to(torch.uint8).flatten(1), scale, low + 8 * scale)


class Int4Linear(nn.Module):
    """y = x W^T + b with W held as packed int4 codes (see the module docstring)."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP_SIZE:
            raise ValueError(f"int4 weights need inputs in groups of {GROUP_SIZE}, "
                             f"not {self.in_features}")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            weight.codes.to(torch.int32).contiguous(), INNER_K_TILES)
        self.register_buffer("weight", packed)
        # [K / 32, N, 2]: the kernel's layout of each group's scale and offset.
        self.register_buffer("scales_and_zeros", torch.stack(
            [weight.scale.t(), weight.zero.t()], dim=-1).to(COMPUTE_DTYPE).contiguous())
        self.register_buffer("bias", bias)
        self.unpacks = kernel_packing() is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.unpacks and rows.shape[0] >= DEQUANTIZE_FROM_ROWS:
            # float32 whatever the model dtype: a bfloat16 matmul is several times slower than
            # the kernel on CPUs without native bfloat16.
            return linear_output(F.linear(rows.float(), self.dequantized()), x, self.bias)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.to(COMPUTE_DTYPE).contiguous(), self.weight, GROUP_SIZE, self.scales_and_zeros)
        return linear_output(y, x, self.bias)

    def dequantized(self) -> torch.Tensor:
        """The [N, K] float32 weight the kernel multiplies by, (q - 8) * scale + zero with its
        bfloat16 scales and offsets, computed as q * scale + (zero - 8 * scale) (one pass
        fewer)."""
        weight = unpack_codes(self.weight, self.out_features, self.in_features)
        scale, zero = self.scales_and_zeros.float().permute(2, 1, 0)  # each [N, K / 32]
        groups = weight.view(self.out_features, -1, GROUP_SIZE)
        groups.mul_(scale.unsqueeze(2)).add_((zero - 8 * scale).unsqueeze(2))
        return weight

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"weight=int4, group_size={GROUP_SIZE}")


class Int4MergedLinear(SplitParts, Int4Linear):
    """MergedLinear with int4 weights: one matmul, its output split into the declared parts."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None, parts: dict[str, int]):
        super().__init__(weight, bias)
        self.parts = dict(parts)
