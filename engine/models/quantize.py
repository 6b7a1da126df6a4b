"""Weight quantization at load (`--quantization int8|fp8|gguf`) and the bytes the weights take.

Quantized: the q/k/v, o, gate/up and down projections, which hold most of a model's weights
and most of the bytes a decode step reads. Kept in the model dtype: embeddings, norms and the
LM head. The LM head writes the logits directly; in small models with large vocabularies
(SmolLM2: 49152 x 576, a fifth of its weights) its error dominates the logits' error, and
vLLM keeps it unquantized too.

`gguf` keeps what a GGUF file stores instead of quantizing anything anew: Q4_0/Q4_1 linears
as int4 codes (exactly the file's), Q8_0 linears as int8 per output channel (requantized from
the file's blocks of 32), the LM head included when the file stores it so (llama.cpp reads it
that way too); everything else dequantized as before. CPU only, one rank.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.layers.fp8_matmul import FP8_DTYPE
from tokenmill.engine.layers.int4_linear import (
    COMPUTE_DTYPE,
    Int4Linear,
    Int4MergedLinear,
    Int4Weight,
    int4_supported,
)
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.quantized_linear import WEIGHT_DTYPES, quantize_linear
from tokenmill.engine.models.decoder import CausalLM
from tokenmill.engine.models.moe import SparseMoeBlock

KEPT_GGUF_TYPES = ("Q4_0", "Q4_1", "Q8_0")
METHODS = (*WEIGHT_DTYPES, "gguf", "none")


def check_quantization(method: str | None) -> None:
    """ConfigError for a method this torch can never run, before any weight is loaded."""
    if method is not None and method not in METHODS:
        raise ConfigError("quantization", f"{method!r} is not one of {sorted(METHODS)}")
    if method == "fp8" and FP8_DTYPE is None:
        raise ConfigError("quantization", "fp8 needs torch's float8 dtypes, which this torch "
                                          "build lacks; use int8 or a newer torch")


def quantize_model(model: CausalLM, method: str) -> None:
    """Replace the decoder layers' projections by their quantized twins, one at a time.

    Each full-precision weight is released as its replacement takes its place, so memory
    peaks near the unquantized model's size plus one quantized projection.
    """
    for parent in list(model.model.layers.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, quantize_linear(child, method))


def check_gguf_kept(device: torch.device, tp_size: int, gguf_file: str | None) -> None:
    """ConfigError where `--quantization gguf` cannot run: it keeps a GGUF file's blocks for
    the CPU's int4 and int8 kernels, on one rank."""
    if gguf_file is None:
        raise ConfigError("quantization", "gguf keeps a GGUF file's quantized weights; this "
                                          "model is not a GGUF file (use int8 or fp8)")
    if not int4_supported(device):
        raise ConfigError("quantization", f"gguf runs on the CPU only (this engine runs on "
                                          f"{device.type}); use none or int8")
    if tp_size != 1:
        raise ConfigError("quantization", "gguf runs with tensor_parallel_size 1; use none")


def auto_quantization(types: dict[str, str], device: torch.device, tp_size: int) -> str | None:
    """What an unset --quantization means for a GGUF file's tensor types: keep the file's
    quantization where the CPU kernels take it, else dequantize (None)."""
    kept = any(kind in KEPT_GGUF_TYPES for name, kind in types.items()
               if name.endswith("_proj.weight"))
    return "gguf" if kept and int4_supported(device) and tp_size == 1 else None


def keep_gguf_quantization(model: CausalLM, types: dict[str, str],
                           int4: dict[str, Int4Weight]) -> None:
    """Swap each linear for the kind its GGUF tensors are stored as (see the module
    docstring); `types` are the file's storage types and `int4` its 4-bit tensors, by HF
    name. A merged projection is kept quantized only when all its parts share a kept type."""
    for path, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        names = _stored_names(model, path, module)
        kinds = {types.get(name) for name in names}
        if len(kinds) != 1 or (kind := kinds.pop()) not in KEPT_GGUF_TYPES:
            continue
        parent, _, attr = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, _kept_linear(module, kind, [int4.get(n) for n in names]))


def _stored_names(model: CausalLM, path: str, module: nn.Linear) -> list[str]:
    """The checkpoint names of a linear's weight: a merged layer's parts, a tied head's
    embedding."""
    if module is model.lm_head and module.weight is model.model.embed_tokens.weight:
        return ["model.embed_tokens.weight"]
    if isinstance(module, MergedLinear):
        prefix = path.rpartition(".")[0]
        return [f"{prefix}.{part}.weight" for part in module.parts]
    return [f"{path}.weight"]


def _kept_linear(module: nn.Linear, kind: str, codes: list[Int4Weight | None]) -> nn.Module:
    if kind == "Q8_0":
        return quantize_linear(module, "int8", compute_dtype=COMPUTE_DTYPE)
    bias = None if module.bias is None else module.bias.detach()
    weight = Int4Weight.cat(codes)
    if isinstance(module, MergedLinear):
        return Int4MergedLinear(weight, bias, module.parts)
    return Int4Linear(weight, bias)


def step_weight_bytes(model: CausalLM) -> int:
    """The weight bytes a decode step reads at least: all of them but an input embedding table
    the LM head does not share (a step reads only its batch's rows of it) and, in a mixture
    of experts, the experts a single token does not choose (top_k of each layer's experts are
    read; a larger batch reads more of them). An encoder (no LM head) reads its layers and
    its batch's rows of its embedding tables."""
    if not hasattr(model, "lm_head"):
        return weight_bytes(model) - weight_bytes(model.embeddings)
    embeddings = model.model.embed_tokens.weight
    head = getattr(model.lm_head, "weight", None)
    unread = 0 if head is not None and head.data_ptr() == embeddings.data_ptr() \
        else embeddings.nbytes
    for block in model.modules():
        if isinstance(block, SparseMoeBlock):
            experts = weight_bytes(block.experts)
            unread += experts - experts * block.shape.top_k // block.shape.num_experts
    return weight_bytes(model) - unread


def weight_bytes(module: nn.Module) -> int:
    """Bytes of the weights in memory: parameters and persistent buffers at their stored
    size (quantized weights and their scales included), a tied tensor counted once. Tables
    computed at load (rotary cos/sin, non-persistent) are not weights."""
    sizes = {t.data_ptr(): t.nbytes for t in module.state_dict(keep_vars=True).values()}
    return sum(sizes.values())
