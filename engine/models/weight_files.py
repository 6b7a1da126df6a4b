"""Which files of a model directory hold its weights.

Mistral's repositories publish the same weights twice: in Hugging Face's layout
(model-0000N-of-0000M.safetensors, listed by model.safetensors.index.json) and in Mistral's
own (consolidated.safetensors, other tensor names). The engine reads the first only, and the
hub download skips the second. Models published before safetensors have PyTorch's pickled
files only (pytorch_model.bin, or shards listed by pytorch_model.bin.index.json): read where
no safetensors weights are, skipped where they are. Imports no torch: the download (an init
container) uses it."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable

from tokenmill.engine.models.source import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"
TORCH_INDEX_FILE = "pytorch_model.bin.index.json"
TORCH_WEIGHTS = "pytorch_model*.bin"


def skipped_weight_files(names: Iterable[str]) -> list[str]:
    """Of a model's file names, the weight files that are not its Hugging Face safetensors
    weights, where it has those: Mistral's consolidated files, where other safetensors files
    are there too, and PyTorch's pickled copies."""
    names = list(names)
    weights = [name for name in names if name.endswith(".safetensors")]
    consolidated = [name for name in weights
                    if os.path.basename(name).startswith("consolidated")]
    skipped = consolidated if len(consolidated) < len(weights) else []
    if weights:
        skipped += [name for name in names if name.endswith(".bin")]
    return skipped


def torch_weight_files(directory: str) -> list[str]:
    """The paths of the model's PyTorch weight files: those its index names, where it has one
    (all of them must be there), else every pytorch_model*.bin file."""
    index = os.path.join(directory, TORCH_INDEX_FILE)
    if os.path.isfile(index):
        return _indexed(directory, index)
    return sorted(glob.glob(os.path.join(directory, TORCH_WEIGHTS)))


def _indexed(directory: str, index: str) -> list[str]:
    """The files an index's weight_map names, each of which must be in the directory."""
    try:
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError.reading(index, exc) from exc
    missing = [name for name in names if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise ModelLoadError(f"{os.path.basename(index)} names {missing[0]}, which is not in "
                             f"{directory} ({len(missing)} of {len(names)} weight files "
                             "missing: an incomplete download?)")
    return [os.path.join(directory, name) for name in names]


def weight_files(directory: str) -> list[str]:
    """The paths of the model's weight files: those its index names, where it has one (all of
    them must be there), else every safetensors file but Mistral's consolidated copies."""
    index = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index):
        return _indexed(directory, index)
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory,
                                                                       "*.safetensors")))
    skipped = set(skipped_weight_files(names))
    return [os.path.join(directory, name) for name in names if name not in skipped]
