"""A layer-truncated copy of a model: its embeddings, first decoder layers, final norm and LM
head, saved as a Hugging Face checkpoint with the same tokenizer. It shares the target's
vocabulary by construction, so it serves as a speculative draft where no smaller model of the
family can be downloaded (its proposals are worse than a trained small model's)."""

from __future__ import annotations

import copy
import os

import torch

from tokenmill.engine.models.source import resolve_model


def save_truncated(model: str, directory: str, num_layers: int) -> str:
    """Save `model` (anything --model accepts that is local: a directory, a .gguf file, a
    built-in name) with only its first num_layers layers into `directory`; return it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model(model)
    extra = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    hf = AutoModelForCausalLM.from_pretrained(source.directory, dtype=torch.float32, **extra)
    total = hf.config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in 1..{total}, got {num_layers}")
    # A fresh model of the smaller config takes the weights: one loaded from GGUF counts as
    # quantized in transformers and will not save.
    config = copy.deepcopy(hf.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    small = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, _ = small.load_state_dict(hf.state_dict(), strict=False)
    if missing:
        raise ValueError(f"the truncated model lacks weights: {missing[:5]}")
    os.makedirs(directory, exist_ok=True)
    small.save_pretrained(directory)
    AutoTokenizer.from_pretrained(source.directory, **extra).save_pretrained(directory)
    return directory
