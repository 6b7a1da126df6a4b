"""PyTorch's pickled checkpoints (pytorch_model*.bin), read where a model has no safetensors
weights (those published before safetensors: OPT, GPT-J, MPT and their fine-tunes).

torch.load runs with weights_only, its unpickler that builds tensors and plain containers
and calls no other code, and memory-maps the files, so that a tensor-parallel rank reads the
pages of its own shard only."""

from __future__ import annotations

import os

import torch

from tokenmill.engine.models.source import ModelLoadError


def read_torch_weights(files: list[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the files by name, memory-mapped where the file is in torch's zip
    format (the legacy format of torch before 1.6 is read whole)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError.reading(f"the weights in {path}", exc) from exc
        if not isinstance(state, dict):
            raise ModelLoadError(f"{path} holds a {type(state).__name__}, not a dict of "
                                 "tensors by name")
        tensors.update((name, t) for name, t in state.items() if isinstance(t, torch.Tensor))
    return tensors


def torch_files_bytes(files: list[str]) -> int:
    return sum(os.path.getsize(path) for path in files)
