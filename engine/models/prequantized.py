"""Checkpoints published already quantized, as their config's `quantization_config` says.

The engine reads two kinds, dequantizing each weight at load into the model's dtype (where
every such value is exact) and then serving it as any weight (`--quantization fp8` stores it
in 8 bits again, per channel):
- FP8 (`quant_method` `fp8`, transformers' fine-grained FP8: Qwen3-*-FP8, with
  `weight_scale_inv` per block of `weight_block_size`; or `compressed-tensors` with 8-bit
  float weights: RedHatAI's and Neural Magic's *-FP8 models, with `weight_scale` per tensor or
  per output channel). Activation and KV-cache scales (`input_scale`, `k_scale`, ...) are not
  read: activations stay in the model's dtype, and `--kv-cache-dtype` scales the cache per
  token as it is written.
- MXFP4 (`mxfp4`): GPT-OSS's experts, `_blocks` beside `_scales` (models/mxfp4.py).
Any other method (AWQ, GPTQ, bitsandbytes, 4-bit compressed-tensors) is refused at load,
naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from tokenmill.engine.models.mxfp4 import BLOCKS, SCALES, dequantize_mxfp4
from tokenmill.engine.models.source import ModelLoadError

FP8_SCALES = ("weight_scale_inv", "weight_scale")
# Scales of what the engine quantizes on the fly, or not at all: activations and the KV cache.
UNNEEDED_SCALES = ("input_scale", "output_scale", "k_scale", "v_scale")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def checkpoint_quantization(config: Any) -> tuple[str, tuple[int, int] | None] | None:
    """(format, FP8 block size or None) of a pre-quantized checkpoint, None for a plain one;
    ModelLoadError for a format the engine does not read."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return None
    if not isinstance(settings, dict):
        settings = settings.to_dict()
    method = settings.get("quant_method")
    if method == "mxfp4":
        return "mxfp4", None
    if method == "fp8" or (method == "compressed-tensors" and _float8_weights(settings)):
        block = settings.get("weight_block_size")
        return "fp8", (tuple(block) if block else None)
    raise ModelLoadError(
        f"the checkpoint is quantized with {method} (config.json's quantization_config); "
        "tokenmill reads unquantized, FP8 and MXFP4 checkpoints: serve the unquantized "
        "model, with --quantization int8 or fp8 for 8-bit weights")


def _float8_weights(settings: dict) -> bool:
    """Whether a compressed-tensors config quantizes every weight group to 8-bit floats."""
    groups = (settings.get("config_groups") or {}).values()
    weights = [group.get("weights") or {} for group in groups]
    return bool(weights) and all(w.get("type") == "float" and w.get("num_bits") == 8
                                 for w in weights)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """An FP8 weight [out, in] times its scale: one number, one per output row ([out] or
    [out, 1]), or one per `block` tile ([ceil(out / b0), ceil(in / b1)])."""
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


def dequantized_tensors(named: list[tuple[str, Any]], kind: str,
                        block: tuple[int, int] | None, read: Callable[[Any], torch.Tensor],
                        model_dtype: torch.dtype) -> Iterator[tuple[str, Any, int]]:
    """The checkpoint's (name, stored) as (name, stored or tensor, count): each quantized
    weight with its scales becomes one dequantized tensor under the weight's plain name
    (an MXFP4 pair transposed to the unquantized layout, as GPT-OSS keeps its experts); other
    tensors pass as they are, activation scales are dropped. `read` reads a stored tensor
    (which has a `dtype`) whole; `count` is how many are yielded in all."""
    parts = {name: _part(name, stored, kind) for name, stored in named}
    total = sum(1 for part in parts.values() if part is None or part[1] == "values")
    pending: dict[str, dict[str, Any]] = {}
    for name, stored in named:
        part = parts[name]
        if part is None:
            yield name, stored, total
            continue
        base, role = part
        if role == "drop":
            continue
        halves = pending.setdefault(base, {})
        halves[role] = stored
        if len(halves) < 2:
            continue
        del pending[base]
        values, scales = read(halves["values"]), read(halves["scales"])
        if kind == "mxfp4":
            yield base, dequantize_mxfp4(values, scales, model_dtype).transpose(-1, -2), total
        else:
            yield base, dequantize_fp8(values, scales, block, model_dtype), total
    for base, halves in pending.items():
        lacking = "scales" if "values" in halves else "quantized values"
        raise ModelLoadError(f"quantized tensor {base!r} has no {lacking} in the checkpoint")


def _part(name: str, stored: Any, kind: str) -> tuple[str, str] | None:
    """(the weight's name, "values" | "scales" | "drop") of a quantized weight's tensor, None
    for any other tensor."""
    if kind == "mxfp4":
        for suffix, role in ((BLOCKS, "values"), (SCALES, "scales")):
            if name.endswith(suffix):
                return name[:-len(suffix)], role
        return None
    module, _, attr = name.rpartition(".")
    if attr in FP8_SCALES:
        return f"{module}.weight", "scales"
    if attr in UNNEEDED_SCALES:
        return f"{module}.weight", "drop"
    if attr == "weight" and stored.dtype in FP8_DTYPES:
        return name, "values"
    return None
