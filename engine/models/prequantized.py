"""Checkpoints published already quantized, as their config's `quantization_config` says.

The engine reads two kinds, dequantizing each weight at load into the model's dtype (where
every such value is exact) and then serving it as any weight (`--quantization fp8` stores it
in 8 bits again, per channel):
- FP8 (`quant_method` `fp8`, transformers' fine-grained FP8: Qwen3-*-FP8, with
  `weight_scale_inv` per block of `weight_block_size`, or one per tensor without it as
  Mistral publishes Ministral 3; or `compressed-tensors` with 8-bit
  float weights: RedHatAI's and Neural Magic's *-FP8 models, with `weight_scale` per tensor or
  per output channel). Activation and KV-cache scales (`input_scale`, `k_scale`, ...) are not
  read: activations stay in the model's dtype, and `--kv-cache-dtype` scales the cache per
  token as it is written.
- MXFP4 (`mxfp4`): GPT-OSS's experts, `_blocks` beside `_scales` (models/mxfp4.py).
- GPTQ (`gptq`, 4 or 8 bits), AWQ (`awq`, 4-bit GEMM) and compressed-tensors' integer
  weights packed into int32 words (`pack-quantized`: llm-compressor's W4A16, W8A16), with a
  scale and zero point per group (models/packed_int.py). Dequantized, such a model takes its
  dtype's two bytes per parameter, not half a byte.
- compressed-tensors' 8-bit integer weights stored as they are (`int-quantized`: W8A8-INT8),
  each times its per-channel `weight_scale`, then stored in 8 bits again (`--quantization
  int8`) unless asked otherwise; the activations are not quantized.
Any other method (bitsandbytes, ...) is refused at load, naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from tokenmill.engine.models.mxfp4 import BLOCKS, SCALES, dequantize_mxfp4
from tokenmill.engine.models.packed_int import (
    COMPRESSED_PARTS,
    PACKED_PARTS,
    REQUIRED_PARTS,
    compressed_format,
    dequantize_packed,
    packed_format,
)
from tokenmill.engine.models.source import ModelLoadError

FP8_SCALES = ("weight_scale_inv", "weight_scale")
# Scales of what the engine quantizes on the fly, or not at all: activations (compressed-tensors'
# input_scale, transformers' static FP8 activation_scale) and the KV cache.
UNNEEDED_SCALES = ("input_scale", "activation_scale", "output_scale", "k_scale", "v_scale")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# A checkpoint's 8-bit weights stored as they are, by kind, and each one's value dtypes.
SCALED_DTYPES = {"fp8": FP8_DTYPES, "int8": (torch.int8,)}


def checkpoint_quantization(config: Any) -> tuple[str, Any] | None:
    """(format, its detail) of a pre-quantized checkpoint, None for a plain one: FP8's block
    size (or None), GPTQ's and AWQ's PackedFormat. ModelLoadError for a format the engine does
    not read."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return None
    if not isinstance(settings, dict):
        settings = settings.to_dict()
    method = settings.get("quant_method")
    if method == "mxfp4":
        return "mxfp4", None
    kinds = _weight_kinds(settings) if method == "compressed-tensors" else set()
    if method == "fp8" or kinds == {("float", 8)}:
        block = settings.get("weight_block_size")
        return "fp8", (tuple(block) if block else None)
    if method in ("gptq", "awq"):
        return "packed", packed_format(method, settings)
    if method == "compressed-tensors":
        layout = settings.get("format")
        if layout == "pack-quantized" and kinds in ({("int", 4)}, {("int", 8)}):
            return "packed", compressed_format(next(iter(kinds))[1])
        if layout == "int-quantized" and kinds == {("int", 8)}:
            return "int8", None
        described = ", ".join(sorted(f"{bits}-bit {kind}" for kind, bits in kinds))
        method = f"compressed-tensors ({layout} of {described or 'no weights'})"
    raise ModelLoadError(
        f"the checkpoint is quantized with {method} (config.json's quantization_config); "
        "tokenmill reads unquantized, FP8, MXFP4, GPTQ, AWQ and compressed-tensors' integer "
        "checkpoints: serve the unquantized model, with --quantization int8 or fp8 for 8-bit "
        "weights")


def _weight_kinds(settings: dict) -> set[tuple[Any, Any]]:
    """The (type, num_bits) pairs a compressed-tensors config quantizes its weight groups to:
    ("float", 8) for FP8, ("int", 4) for W4A16, ..."""
    groups = (settings.get("config_groups") or {}).values()
    return {(w.get("type"), w.get("num_bits")) for w in (g.get("weights") or {} for g in groups)}


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """An FP8 (or int8) weight [out, in] times its scale: one number, one per output row
    ([out] or [out, 1]), or one per `block` tile ([ceil(out / b0), ceil(in / b1)])."""
    values = weight.float()
    scale = scale.float()
    rows, columns = values.shape
    if scale.numel() == 1:
        return (values * scale.reshape(())).to(dtype)
    if scale.numel() == rows:
        return (values * scale.reshape(rows, 1)).to(dtype)
    if block is None or scale.shape != (-(-rows // block[0]), -(-columns // block[1])):
        raise ModelLoadError(f"an FP8 scale of shape {tuple(scale.shape)} does not fit a "
                             f"weight of shape {(rows, columns)}"
                             + (f" in blocks of {block}" if block else ""))
    tiled = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)
    return (values * tiled[:, :columns]).to(dtype)


def dequantized_tensors(named: list[tuple[str, Any]], kind: str, detail: Any,
                        read: Callable[[Any], torch.Tensor],
                        model_dtype: torch.dtype) -> Iterator[tuple[str, Any, int]]:
    """The checkpoint's (name, stored) as (name, stored or tensor, count): each quantized
    weight with its scales (and zero points) becomes one dequantized tensor under the weight's
    plain name (an MXFP4 pair transposed to the unquantized layout, as GPT-OSS keeps its
    experts); other tensors pass as they are, activation scales are dropped. `detail` is
    checkpoint_quantization's; `read` reads a stored tensor (which has a `dtype`) whole;
    `count` is how many are yielded in all."""
    parts = {name: _part(name, stored, kind, detail) for name, stored in named}
    expected: dict[str, set[str]] = {}
    for part in parts.values():
        if part is not None and part[1] != "drop":
            expected.setdefault(part[0], set()).add(part[1])
    required = REQUIRED_PARTS[detail.method] if kind == "packed" else {"values", "scales"}
    for base, roles in expected.items():
        if not required <= roles:
            lacking = ", ".join(sorted(required - roles))
            raise ModelLoadError(f"quantized tensor {base!r} has no {lacking} in the "
                                 "checkpoint")
    total = sum(1 for part in parts.values() if part is None) + len(expected)
    pending: dict[str, dict[str, Any]] = {}
    for name, stored in named:
        part = parts[name]
        if part is None:
            yield name, stored, total
            continue
        base, role = part
        if role == "drop":
            continue
        arrived = pending.setdefault(base, {})
        arrived[role] = stored
        if set(arrived) != expected[base]:
            continue
        del pending[base]
        yield base, _dequantized(kind, detail, {r: read(t) for r, t in arrived.items()},
                                 model_dtype), total


def _dequantized(kind: str, detail: Any, parts: dict[str, torch.Tensor],
                 dtype: torch.dtype) -> torch.Tensor:
    if kind == "mxfp4":
        return dequantize_mxfp4(parts["values"], parts["scales"], dtype).transpose(-1, -2)
    if kind == "packed":
        return dequantize_packed(parts, detail, dtype)
    return dequantize_fp8(parts["values"], parts["scales"], detail, dtype)  # fp8, int8


def _part(name: str, stored: Any, kind: str, detail: Any) -> tuple[str, str] | None:
    """(the weight's name, its role: "values", "scales", ... or "drop") of a quantized
    weight's tensor, None for any other tensor."""
    if kind == "mxfp4":
        for suffix, role in ((BLOCKS, "values"), (SCALES, "scales")):
            if name.endswith(suffix):
                return name[:-len(suffix)], role
        return None
    module, _, attr = name.rpartition(".")
    if kind == "packed":
        roles = COMPRESSED_PARTS if detail.method == "compressed" else PACKED_PARTS
        role = roles.get(attr)
        return None if role is None else (f"{module}.weight", role)
    if attr in FP8_SCALES:
        return f"{module}.weight", "scales"
    if attr in UNNEEDED_SCALES:
        return f"{module}.weight", "drop"
    if attr == "weight" and stored.dtype in SCALED_DTYPES[kind]:
        return name, "values"
    return None
