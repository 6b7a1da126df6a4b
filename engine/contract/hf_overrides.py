"""--hf-overrides (vLLM's flag): changes to the model's Hugging Face config, as a JSON object,
and vLLM's older --rope-scaling and --rope-theta, folded into the same object."""

from __future__ import annotations

import json
from typing import Any

ROPE_SCALING_EXAMPLE = ('{"rope_type": "yarn", "factor": 4.0, '
                        '"original_max_position_embeddings": 32768}')


class HFOverridesError(ValueError):
    """An override that can never apply: `option` names the flag, the message says why."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def json_object(text: str | dict[str, Any], option: str) -> dict[str, Any]:
    """JSON text's object, or the object itself (the offline API takes a dict, as vLLM's
    LLM does)."""
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise HFOverridesError(option, f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise HFOverridesError(option, f"must be a JSON object, got {type(value).__name__}")
    return value


def hf_overrides(overrides: str | dict[str, Any] | None, rope_scaling: str | None,
                 rope_theta: float | None) -> dict[str, Any]:
    """The config changes the three flags ask for (--rope-scaling and --rope-theta win over
    the same keys in --hf-overrides)."""
    changes = json_object(overrides, "hf_overrides") if overrides else {}
    if rope_scaling is not None:
        changes["rope_scaling"] = json_object(rope_scaling, "rope_scaling")
    if rope_theta is not None:
        if rope_theta <= 0:
            raise HFOverridesError("rope_theta", f"must be positive, got {rope_theta}")
        changes["rope_theta"] = rope_theta
    if not isinstance(changes.get("rope_scaling", {}), dict):
        raise HFOverridesError("hf_overrides", "rope_scaling must be a JSON object such as "
                                               + ROPE_SCALING_EXAMPLE)
    return changes
