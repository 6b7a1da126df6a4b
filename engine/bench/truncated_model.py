"""A layer-truncated copy of a model: its embeddings, first decoder layers, final norm and LM
head, saved as a Hugging Face checkpoint with the same tokenizer. It shares the target's
vocabulary by construction, so it serves as a speculative draft where no smaller model of the
family can be downloaded (its proposals are worse than a trained small model's)."""

from __future__ import annotations

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
    layers = hf.model.layers
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers must be in 1..{len(layers)}, got {num_layers}")
    hf.model.layers = torch.nn.ModuleList(list(layers)[:num_layers])
    hf.config.num_hidden_layers = num_layers
    if getattr(hf.config, "layer_types", None):
        hf.config.layer_types = hf.config.layer_types[:num_layers]
    os.makedirs(directory, exist_ok=True)
    hf.save_pretrained(directory)
    AutoTokenizer.from_pretrained(source.directory, **extra).save_pretrained(directory)
    return directory
