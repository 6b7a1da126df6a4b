"""GPTQ, AWQ and compressed-tensors' packed checkpoints: integer weights packed into int32
words, in groups of input rows that share a scale and a zero point, dequantized at load into
the model's dtype.

Each quantized projection stores `qweight`, `qzeros` and `scales` (and GPTQ's `g_idx`, each
input row's group, which act-order reorders) in place of `weight`; the value of input row i,
output column o is (q[i, o] - zero[g(i), o]) * scale[g(i), o].
- GPTQ (AutoGPTQ, GPTQModel; 4 or 8 bits): qweight [in * bits / 32, out] packs consecutive
  input rows into a word, lowest bits first; qzeros [groups, out * bits / 32] packs output
  columns the same way. Its original format (`checkpoint_format` gptq, the default) stores
  each zero point less one; gptq_v2 stores it as it is.
- AWQ (AutoAWQ's GEMM layout; 4 bits): qweight [in, out / 8] and qzeros [groups, out / 8]
  pack eight output columns into a word in the order 0, 2, 4, 6, 1, 3, 5, 7, lowest bits
  first.
- compressed-tensors' `pack-quantized` (llm-compressor's W4A16 and W8A16; 4 or 8 bits):
  `weight_packed` [out, in * bits / 32] packs consecutive input columns of the [out, in]
  weight, lowest bits first, each value stored plus 2 ** (bits - 1) (signed integers made
  unsigned); `weight_scale` [out, groups]; asymmetric schemes add `weight_zero_point`
  [out * bits / 32, groups], packed along the output rows the same way, and act-order
  `weight_g_idx` [in]; `weight_shape` is the unpacked shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.engine.models.source import ModelLoadError

# The tensors of one packed projection, by their suffix, and the role each plays.
PACKED_PARTS = {"qweight": "values", "qzeros": "zeros", "scales": "scales", "g_idx": "groups"}
COMPRESSED_PARTS = {"weight_packed": "values", "weight_zero_point": "zeros",
                    "weight_scale": "scales", "weight_g_idx": "groups", "weight_shape": "shape"}
REQUIRED_PARTS = {"gptq": frozenset({"values", "zeros", "scales"}),
                  "awq": frozenset({"values", "zeros", "scales"}),
                  "compressed": frozenset({"values", "scales", "shape"})}
# The output column held by each 4-bit field of an AWQ word, from the lowest bits up.
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class PackedFormat:
    method: str       # "gptq", "awq" or "compressed" (compressed-tensors' pack-quantized)
    bits: int
    group_size: int   # input rows per group; -1: one group for every row
    zero_offset: int  # added to each stored zero point (GPTQ's original format: 1)


def packed_format(method: str, settings: dict) -> PackedFormat:
    """The packing a GPTQ or AWQ quantization_config describes; ModelLoadError for one the
    engine does not read."""
    bits = int(settings.get("bits", settings.get("w_bit", 4)))
    group = int(settings.get("group_size", settings.get("q_group_size", 128)))
    if method == "awq":
        version = str(settings.get("version", "gemm")).lower()
        if version != "gemm" or bits != 4 or settings.get("zero_point", True) is False:
            raise ModelLoadError(f"AWQ {version} with {bits} bits"
                                 f"{'' if settings.get('zero_point', True) else ', no zero point'}"
                                 " is not read; tokenmill reads AWQ's 4-bit GEMM checkpoints")
        return PackedFormat("awq", 4, group, 0)
    if bits not in (4, 8):
        raise ModelLoadError(f"GPTQ with {bits} bits is not read; tokenmill reads 4- and 8-bit "
                             "GPTQ checkpoints")
    original = settings.get("checkpoint_format", "gptq") == "gptq"
    return PackedFormat("gptq", bits, group, 1 if original else 0)


def compressed_format(bits: int) -> PackedFormat:
    """compressed-tensors' pack-quantized weights of `bits` (its groups are read from the
    scales' shape)."""
    if bits not in (4, 8):
        raise ModelLoadError(f"compressed-tensors' pack-quantized weights of {bits} bits are "
                             "not read; tokenmill reads 4- and 8-bit ones")
    return PackedFormat("compressed", bits, 0, 0)


def dequantize_packed(parts: dict[str, torch.Tensor], fmt: PackedFormat,
                      dtype: torch.dtype) -> torch.Tensor:
    """One projection's weight [out, in] in `dtype` from its packed parts (by role:
    values, zeros, scales and, for GPTQ, groups)."""
    if fmt.method == "compressed":
        return _dequantize_compressed(parts, fmt.bits, dtype)
    if fmt.method == "awq":
        values = _awq_columns(_unpack_columns(parts["values"], 4))
        zeros = _awq_columns(_unpack_columns(parts["zeros"], 4))
    else:
        values = _unpack_rows(parts["values"], fmt.bits)
        zeros = _unpack_columns(parts["zeros"], fmt.bits) + fmt.zero_offset
    rows = values.shape[0]
    groups = parts.get("groups")
    if groups is None:
        groups = torch.arange(rows) // (rows if fmt.group_size == -1 else fmt.group_size)
    return _grouped(values, zeros, parts["scales"].float(), groups, dtype)


def _dequantize_compressed(parts: dict[str, torch.Tensor], bits: int,
                           dtype: torch.dtype) -> torch.Tensor:
    """compressed-tensors' pack-quantized weight, turned to GPTQ's orientation ([in, out]):
    its groups are consecutive input columns, as many as the scales have, unless
    weight_g_idx assigns them."""
    rows, columns = (int(n) for n in parts["shape"].tolist())
    offset = 1 << (bits - 1)
    values = _unpack_columns(parts["values"], bits)[:, :columns] - offset
    scales = parts["scales"].float().reshape(rows, -1)
    count = scales.shape[1]
    groups = parts.get("groups")
    if groups is None:
        if columns % count:
            raise ModelLoadError(f"packed weight of {columns} input columns does not split "
                                 f"into its {count} groups of scales")
        groups = torch.arange(columns) // (columns // count)
    zeros = parts.get("zeros")
    if zeros is not None:
        zeros = (_unpack_rows(zeros, bits)[:rows] - offset).t()
    return _grouped(values.t(), zeros, scales.t(), groups, dtype)


def _grouped(values: torch.Tensor, zeros: torch.Tensor | None, scales: torch.Tensor,
             groups: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight [out, in] in `dtype` from integers `values` [in, out], each input row less
    its group's zero point (`zeros` [groups, >= out], None: 0) times its group's scale
    (`scales` [groups, out]); `groups` [in] names each row's group."""
    rows, columns = values.shape
    groups = groups.long()
    if scales.shape[1] != columns or (zeros is not None and zeros.shape[1] < columns) or \
            groups.numel() != rows or int(groups.max()) >= scales.shape[0]:
        raise ModelLoadError(f"packed weight of {rows} x {columns} values does not fit its "
                             f"{groups.numel()} group indices, zero points "
                             f"{None if zeros is None else tuple(zeros.shape)} and scales "
                             f"{tuple(scales.shape)}")
    weight = values.float()
    if zeros is not None:
        weight = weight - zeros[:, :columns][groups].float()
    return (weight * scales[groups]).t().contiguous().to(dtype)


def _fields(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Every `bits`-wide field of each int32 word, lowest first: [..., words, 32 / bits]."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = (1 << bits) - 1
    return (packed.to(torch.int32).unsqueeze(-1) >> shifts) & mask


def _unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[words, out] packed along the rows -> [words * 32 / bits, out]."""
    fields = _fields(packed, bits)  # [words, out, per]
    return fields.permute(0, 2, 1).reshape(-1, packed.shape[1])


def _unpack_columns(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, words] packed along the columns -> [rows, words * 32 / bits]."""
    return _fields(packed, bits).reshape(packed.shape[0], -1)


def _awq_columns(fields: torch.Tensor) -> torch.Tensor:
    """AWQ's columns in their order: field k of each word holds column AWQ_PACK_ORDER[k]."""
    rows = fields.shape[0]
    inverse = sorted(range(8), key=lambda k: AWQ_PACK_ORDER[k])
    return fields.view(rows, -1, 8)[:, :, inverse].reshape(rows, -1)
