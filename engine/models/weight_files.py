"""Which *.safetensors files of a model directory hold its weights.

Mistral's repositories publish the same weights twice: in Hugging Face's layout
(model-0000N-of-0000M.safetensors, listed by model.safetensors.index.json) and in Mistral's
own (consolidated.safetensors, other tensor names). The engine reads the first only, and the
hub download skips the second. Imports no torch: the download (an init container) uses it."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable

from tokenmill.engine.models.source import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


def skipped_weight_files(names: Iterable[str]) -> list[str]:
    """Of a model's file names, the safetensors files that are not its Hugging Face weights:
    Mistral's consolidated files, where other safetensors files are there too."""
    weights = [name for name in names if name.endswith(".safetensors")]
    consolidated = [name for name in weights
                    if os.path.basename(name).startswith("consolidated")]
    return consolidated if len(consolidated) < len(weights) else []


def weight_files(directory: str) -> list[str]:
    """The paths of the model's weight files: those its index names, where it has one (all of
    them must be there), else every safetensors file but Mistral's consolidated copies."""
    index = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError.reading(index, exc) from exc
        missing = [name for name in names if not os.path.isfile(os.path.join(directory, name))]
        if missing:
            raise ModelLoadError(f"{INDEX_FILE} names {missing[0]}, which is not in "
                                 f"{directory} ({len(missing)} of {len(names)} weight files "
                                 "missing: an incomplete download?)")
        return [os.path.join(directory, name) for name in names]
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory,
                                                                       "*.safetensors")))
    skipped = set(skipped_weight_files(names))
    return [os.path.join(directory, name) for name in names if name not in skipped]
