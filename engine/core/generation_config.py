"""A model's recommended sampling settings (generation_config.json), as vLLM reads them, and
vLLM's --generation-config: "auto" (the model's), "vllm" (none: the API's defaults) or a
directory holding another generation_config.json."""

from __future__ import annotations

import os
from typing import Any

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.contract.server_flags import GENERATION_CONFIG_KEYS


def load_generation_config(directory: str) -> Any:
    """The model's generation_config.json as transformers reads it; None without one."""
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(directory)
    except (OSError, ValueError):
        return None


def generation_defaults(generation_config: Any) -> dict[str, float]:
    """The sampling settings a generation config sets (what transformers' to_diff_dict
    reports, as vLLM reads it); {} without one."""
    if generation_config is None:
        return {}
    diff = generation_config.to_diff_dict()
    return {key: diff[key] for key in GENERATION_CONFIG_KEYS if diff.get(key) is not None}


def checked_source(source: str, option: str = "generation_config") -> str:
    """`source` if it is "auto", "vllm" or a directory holding generation_config.json;
    ConfigError naming `option` otherwise."""
    if source in ("auto", "vllm"):
        return source
    if os.path.isfile(os.path.join(source, "generation_config.json")):
        return source
    raise ConfigError(option, f"{source!r} is neither auto, vllm nor a directory holding "
                              "generation_config.json")


def sampling_defaults(source: str, model_defaults: dict[str, float]) -> dict[str, float]:
    """The settings a request that leaves them out gets: the model's (`model_defaults`,
    under "auto"), none ("vllm"), or those of the generation_config.json in `source`."""
    if source == "auto":
        return dict(model_defaults)
    if source == "vllm":
        return {}
    return generation_defaults(load_generation_config(source))
