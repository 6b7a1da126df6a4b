"""What an embedding checkpoint says about itself: sentence-transformers' modules.json lists the
steps after the transformer (Pooling, Normalize), and the Pooling step's config.json which
hidden states it reads. The engine serves the same embedding that sentence-transformers
computes from the same files."""

from __future__ import annotations

import json
import os
from typing import Any

from tokenmill.engine.contract.pooling import Pooler
from tokenmill.engine.models.architecture import is_bare_decoder, is_bare_encoder
from tokenmill.engine.models.source import ModelLoadError

# Module classes, by the last part of their type: sentence_transformers.models.Pooling before
# version 6, sentence_transformers.sentence_transformer.modules.pooling.Pooling since.
POOLING_MODULE, NORMALIZE_MODULE, TRANSFORMER_MODULE = "Pooling", "Normalize", "Transformer"
# The Pooling config's modes this engine computes, by pooling type: one true
# pooling_mode_* flag before version 6, a pooling_mode name since.
MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN",
         "pooling_mode_cls_token": "CLS", "lasttoken": "LAST", "mean": "MEAN", "cls": "CLS"}


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError.reading(path, exc) from exc


def _modules(directory: str) -> list[dict[str, Any]] | None:
    path = os.path.join(directory, "modules.json")
    if not os.path.isfile(path):
        return None
    modules = _read_json(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelLoadError(f"{path} is not a list of sentence-transformers modules")
    return modules


def embedding_checkpoint(model_config: Any, directory: str) -> bool:
    """Whether runner auto serves this checkpoint for embeddings: a bare decoder or encoder,
    or a model packaged for sentence-transformers (a Pooling module)."""
    if is_bare_decoder(model_config) or is_bare_encoder(model_config):
        return True
    modules = _modules(directory) or []
    return any(_kind(m) == POOLING_MODULE for m in modules)


def model_pooler(directory: str, default: Pooler | None = None) -> Pooler:
    """The checkpoint's own pooling (sentence-transformers files), else `default` (None: LAST
    and normalized, as vLLM embeds a decoder).
    ModelLoadError for a step the engine does not compute (a Dense projection, max pooling):
    serving without it would return a different embedding than the model's."""
    modules = _modules(directory)
    if modules is None:
        return default or Pooler()
    pooler = Pooler(normalize=False)
    for module in modules:
        kind = _kind(module)
        if kind == POOLING_MODULE:
            pooler = Pooler(_pooling_type(directory, module), pooler.normalize)
        elif kind == NORMALIZE_MODULE:
            pooler = Pooler(pooler.pooling_type, True)
        elif kind != TRANSFORMER_MODULE:
            raise ModelLoadError(f"sentence-transformers module {kind!r} (modules.json) is not "
                                 "supported; tokenmill computes Pooling and Normalize")
    return pooler


def _kind(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rpartition(".")[2]


def _pooling_type(directory: str, module: dict[str, Any]) -> str:
    path = os.path.join(directory, str(module.get("path", "")), "config.json")
    config = _read_json(path)
    named = config.get("pooling_mode")
    chosen = [named] if isinstance(named, str) else \
        [mode for mode, on in config.items() if mode.startswith("pooling_mode_") and on]
    if config.get("include_prompt", True) is not True:
        raise ModelLoadError(f"{path}: include_prompt false is not supported; tokenmill pools "
                             "every prompt token")
    if len(chosen) != 1 or chosen[0] not in MODES:
        raise ModelLoadError(f"{path}: pooling modes {chosen} are not supported; tokenmill "
                             f"computes one of {', '.join(sorted(MODES))}")
    return MODES[chosen[0]]
