"""Applying --hf-overrides to a loaded Hugging Face config.

Keys are set as attributes, a JSON object merging into a sub-config it names. The rotary keys
are rebuilt by hand: transformers 5 keeps them in `rope_parameters`, and assigning
`rope_scaling` there drops the rotary base while a bare `rope_theta` is ignored, so a
checkpoint's own base would silently change or stay."""

from __future__ import annotations

import copy
from typing import Any

from tokenmill.engine.layers.rotary import LAYER_TYPES


class ConfigOverrideError(ValueError):
    """An override this config cannot take; the message names the key."""


def apply_config_overrides(config: Any, overrides: dict[str, Any]) -> Any:
    """A copy of `config` with `overrides` applied (a "text_config" object applies to the
    config itself: the engine's config is already a multimodal checkpoint's text config)."""
    config = copy.deepcopy(config)
    changes = dict(overrides)
    text = changes.pop("text_config", None)
    if isinstance(text, dict) and not _is_config(getattr(config, "text_config", None)):
        changes = {**text, **changes}
    elif text is not None:
        changes["text_config"] = text
    scaling, theta = changes.pop("rope_scaling", None), changes.pop("rope_theta", None)
    _merge(config, changes)
    if scaling is not None or theta is not None:
        _set_rope(config, scaling, theta)
    return config


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def _merge(config: Any, changes: dict[str, Any]) -> None:
    for key, value in changes.items():
        current = getattr(config, key, None)
        if isinstance(value, dict) and _is_config(current):
            _merge(current, value)
        else:
            setattr(config, key, value)


def _set_rope(config: Any, scaling: dict | None, theta: float | None) -> None:
    params = dict(getattr(config, "rope_parameters", None) or {})
    if any(kind in params for kind in LAYER_TYPES):
        raise ConfigOverrideError("rope_scaling and rope_theta: this model keeps rotary settings "
                                  "per kind of layer (rope_parameters."
                                  f"{'/'.join(k for k in LAYER_TYPES if k in params)}); "
                                  "override rope_parameters in --hf-overrides instead")
    base = params.get("rope_theta", getattr(config, "rope_theta", None))
    if scaling is not None:
        kept = {k: params[k] for k in ("partial_rotary_factor",) if k in params}
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.pop("type", "default"))
        params = {**kept, **scaling}
    params["rope_theta"] = float(theta if theta is not None else base or 10000.0)
    config.rope_parameters = params
    if hasattr(config, "rope_theta"):
        config.rope_theta = params["rope_theta"]
