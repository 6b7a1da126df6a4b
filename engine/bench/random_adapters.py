"""Random LoRA adapters in PEFT's file format for a model's shape, for benchmarks: speed depends on
the adapters' ranks and target modules, not on their values, so no adapter is downloaded."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import save_file

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection LoRA can target, from a HF config."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    width = config.intermediate_size
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, width),
            "up_proj": (hidden, width), "down_proj": (width, hidden)}


def write_random_adapter(directory: str, config: Any, rank: int, seed: int,
                         targets: tuple[str, ...] = ALL_TARGETS, alpha: float | None = None,
                         std: float = 0.02) -> str:
    """A PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) with random A and B
    for every layer's `targets`; returns the directory."""
    os.makedirs(directory, exist_ok=True)
    shapes = module_shapes(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module in targets:
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            fan_in, fan_out = shapes[module]
            a = torch.randn(rank, fan_in, generator=generator) * std
            b = torch.randn(fan_out, rank, generator=generator) * std
            tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"] = a, b
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
        "lora_alpha": alpha if alpha is not None else 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(targets), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "modules_to_save": None,
        "base_model_name_or_path": getattr(config, "_name_or_path", "") or None,
    }
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f, indent=2)
    return directory
