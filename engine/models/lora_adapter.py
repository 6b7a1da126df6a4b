"""PEFT LoRA adapters on disk (adapter_config.json + adapter_model.safetensors): read, checked
against the base model, and kept as plain per-module tensors.

Only what the engine can serve is accepted: low-rank updates of the attention and MLP
projections, with no bias, no DoRA and no extra trained modules. Anything else is refused with
a message that names the adapter and the offending field, tensor or shape, so a bad adapter
fails when it is added, never in the middle of a step.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.contract.model_shape import ModelShape, gated_queries
from tokenmill.engine.models.architecture import flags_of, moe_shape_of
from tokenmill.engine.models.fused_weights import fused_parts, renamed
from tokenmill.engine.models.multimodal import (
    is_language_model_of_multimodal,
    language_model_weight,
)
from tokenmill.engine.models.rope_order import rotary_halves

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES
# Phi-3's fused projections: an adapter on one is an adapter on each of its parts, with the
# same A and the part's rows of B.
FUSED_MODULES = {"qkv_proj": "self_attn", "gate_up_proj": "mlp"}
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])"
                  r"(?:\.[A-Za-z0-9_-]+)?\.weight$")
_MODULE = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<block>self_attn|mlp)\."
                     r"(?P<kind>[a-z_]+)$")


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served over this base model; the message says why."""


@dataclass(frozen=True)
class ModuleLoRA:
    """One projection's update: delta W = scale * b @ a."""

    a: torch.Tensor  # [r, in_features]
    b: torch.Tensor  # [out_features, r]
    scale: float


@dataclass
class LoRAWeights:
    """An adapter's updates by (layer index, projection name), full (unsharded) shapes."""

    directory: str
    rank: int
    modules: dict[tuple[int, str], ModuleLoRA]


def module_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of every projection an adapter may target."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    hidden, q, inter = config.hidden_size, heads * head_dim, ModelShape.of(config).intermediate_size
    # Qwen3.5's q_proj computes each head's output gate beside its query.
    queries = q * (2 if gated_queries(config) else 1)
    return {"q_proj": (queries, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
            "o_proj": (hidden, q), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
            "down_proj": (hidden, inter)}


def load_adapter(name: str, directory: str, config: Any, max_rank: int) -> LoRAWeights:
    """Read and check the adapter in `directory` for the base model of HF `config`."""
    fail = _failer(name)
    settings = _read_config(directory, fail)
    _check_settings(settings, fail)
    path = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(path):
        fail(f"{WEIGHTS_FILE} is missing from {directory}")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as exc:
        fail(f"cannot read {path}: {exc}")
    pairs = _pairs(tensors, config, fail)
    shapes = module_shapes(config)
    moe = moe_shape_of(config)
    interleaved = flags_of(config).interleaved_rope
    modules: dict[tuple[int, str], ModuleLoRA] = {}
    for (layer, kind), (a, b) in sorted(pairs.items()):
        if kind in MLP_MODULES and moe is not None and moe.is_sparse(layer):
            fail(f"layer {layer} {kind}: that layer's MLP is a mixture of experts, and "
                 "adapters on experts are not served (target the attention projections)")
        rank = a.shape[0]
        if rank > max_rank:
            fail(f"rank {rank} ({kind}) exceeds --max-lora-rank {max_rank}; raise "
                 f"--max-lora-rank to at least {rank}")
        out_features, in_features = shapes[kind]
        want = {"lora_A": (rank, in_features), "lora_B": (out_features, rank)}
        for part, tensor in (("lora_A", a), ("lora_B", b)):
            if tuple(tensor.shape) != want[part]:
                fail(f"layer {layer} {kind}.{part} has shape {tuple(tensor.shape)}, expected "
                     f"{want[part]} for this base model (an adapter trained for another base?)")
        if kind in ("q_proj", "k_proj") and interleaved:  # as the base's rows are
            b = rotary_halves(config, kind, b)
        alpha = _pattern_value(settings.get("alpha_pattern") or {}, layer, kind,
                               settings.get("lora_alpha", 8))
        root = math.sqrt(rank) if settings.get("use_rslora") else rank
        modules[layer, kind] = ModuleLoRA(a, b, float(alpha) / root)
    if not modules:
        fail(f"{WEIGHTS_FILE} holds no LoRA weights")
    return LoRAWeights(directory, max(m.a.shape[0] for m in modules.values()), modules)


def _failer(name: str):
    def fail(message: str):
        raise LoRAAdapterError(f"LoRA adapter {name!r}: {message}")
    return fail


def _read_config(directory: str, fail) -> dict[str, Any]:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isdir(directory):
        fail(f"{directory} is not a directory (it should hold {CONFIG_FILE} and {WEIGHTS_FILE})")
    if not os.path.isfile(path):
        fail(f"{CONFIG_FILE} is missing from {directory}")
    try:
        with open(path) as f:
            settings = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"cannot read {path}: {exc}")
    if not isinstance(settings, dict):
        fail(f"{path} is not a JSON object")
    return settings


def _check_settings(settings: dict[str, Any], fail) -> None:
    """Refuse what the engine's LoRA layers do not compute."""
    if settings.get("peft_type", "LORA") != "LORA":
        fail(f"peft_type {settings['peft_type']!r} is not LORA")
    if settings.get("bias", "none") != "none" or settings.get("lora_bias"):
        fail(f"bias {settings.get('bias')!r} is not served (only \"none\")")
    for field in ("use_dora", "fan_in_fan_out"):
        if settings.get(field):
            fail(f"{field} is not supported")
    for field in ("modules_to_save", "trainable_token_indices", "target_parameters"):
        if settings.get(field):
            fail(f"{field} {settings[field]!r} is not supported: an adapter may change only "
                 f"the projections {', '.join(TARGET_MODULES)}")
    targets = settings.get("target_modules")
    if isinstance(targets, str):
        if targets != "all-linear":
            _check_regex(targets, fail)
        return
    for target in targets or []:
        if target.rpartition(".")[2] not in (*TARGET_MODULES, *FUSED_MODULES):
            fail(f"target module {target!r} is not one of {', '.join(TARGET_MODULES)}")


def _check_regex(pattern: str, fail) -> None:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        fail(f"target_modules {pattern!r} is not a valid regular expression ({exc})")
    for other in ("model.embed_tokens", "lm_head"):
        if regex.fullmatch(other):
            fail(f"target_modules {pattern!r} matches {other}, which is not served")


def _pairs(tensors: dict[str, torch.Tensor], config: Any,
           fail) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """{(layer, kind): (A, B)} from the file's tensor names; refuses anything else. Over a
    multimodal checkpoint's language model, the language model's modules are read under
    their causal names, and another tower's (which never runs on text) are passed over. A
    fused projection's pair becomes its parts' pairs."""
    num_layers = config.num_hidden_layers
    multimodal = is_language_model_of_multimodal(config)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            fail(f"tensor {key!r} is not a LoRA A/B weight of a served projection")
        name = match["module"]
        if multimodal:
            causal = language_model_weight(f"{name}.weight")
            if causal is None:
                continue
            name = causal.removesuffix(".weight")
        name = renamed(config, f"{name}.weight").removesuffix(".weight")  # Llama 4's MLP
        module = _MODULE.match(name)
        kind = module["kind"] if module else name.rpartition(".")[2]
        block = module["block"] if module else None
        fused = module is not None and FUSED_MODULES.get(kind) == block
        if not fused and (kind not in TARGET_MODULES
                          or block != ("mlp" if kind in MLP_MODULES else "self_attn")):
            fail(f"target module {name!r} is not one of {', '.join(TARGET_MODULES)} "
                 "in the decoder layers")
        layer = int(module["layer"])
        if layer >= num_layers:
            fail(f"{key!r} is for layer {layer}, but the base model has {num_layers} layers")
        if not fused:
            found.setdefault((layer, kind), {})[match["ab"]] = tensor
            continue
        for part, start, stop in fused_parts(config, f"{name}.weight"):
            found.setdefault((layer, part.split(".")[-2]), {})[match["ab"]] = (
                tensor if match["ab"] == "A" else tensor[start:stop])
    pairs = {}
    for (layer, kind), parts in found.items():
        if set(parts) != {"A", "B"}:
            fail(f"layer {layer} {kind} has lora_{''.join(parts)} without its pair")
        pairs[layer, kind] = (parts["A"], parts["B"])
    return pairs


def _pattern_value(pattern: dict[str, Any], layer: int, kind: str, default: Any) -> Any:
    """PEFT's per-module override (alpha_pattern): the first key that ends the module name."""
    name = f"model.layers.{layer}.{'mlp' if kind in MLP_MODULES else 'self_attn'}.{kind}"
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default
