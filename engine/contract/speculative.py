"""--speculative-config: vLLM's JSON shape, parsed and checked without torch (the operator
checks `spec.engine.speculative` with the same rules).

  {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
   "prompt_lookup_min": 2}
  {"model": "PATH_OR_NAME", "num_speculative_tokens": 4}    (a draft model: method "draft")

`disable_by_batch_size` (optional) turns speculation off while at least that many sequences
run: a batch that large is no longer bound by reading the weights, so verifying proposals
costs more than it saves. 0 never turns it off. Not given, it is the measured default of the
device type (DEFAULT_DISABLE_BY_BATCH_SIZE).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft")
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64  # the longest suffix prompt lookup matches (prompt_lookup_max)
KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
        "disable_by_batch_size"}
DEFAULT_PROMPT_LOOKUP_MAX = 4
DEFAULT_PROMPT_LOOKUP_MIN = 1
# Where speculation stops paying, by device type, when disable_by_batch_size is not given,
# from `tokenmill bench speculative` (docs/benchmarks.md): on a CPU, text that does not repeat
# its prompt ran slower with n-gram speculation from 8 sequences on. No entry: not measured
# yet (CUDA), so speculation stays on at every batch size, as in vLLM.
DEFAULT_DISABLE_BY_BATCH_SIZE = {"cpu": 8}


class SpeculativeConfigError(ValueError):
    """What is wrong with the speculative configuration, in its own keys' terms."""


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP_MAX
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP_MIN
    model: str | None = None
    disable_by_batch_size: int | None = None

    @classmethod
    def parse(cls, text: str | dict[str, Any]) -> SpeculativeConfig:
        """From the JSON text (or its decoded object); SpeculativeConfigError if invalid."""
        if isinstance(text, str):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise SpeculativeConfigError(f"is not JSON ({e.msg} at character {e.pos})") \
                    from None
        else:
            data = text
        if not isinstance(data, dict):
            raise SpeculativeConfigError("must be a JSON object")
        unknown = sorted(set(data) - KEYS)
        if unknown:
            raise SpeculativeConfigError(f"unknown keys {unknown}; known: {sorted(KEYS)}")
        method = data.get("method") or ("draft" if data.get("model") else None)
        if method not in METHODS:
            raise SpeculativeConfigError(
                f"method {data.get('method')!r} is not one of {list(METHODS)} (or give "
                "\"model\" for a draft model)")
        if method == "draft" and not data.get("model"):
            raise SpeculativeConfigError("method \"draft\" needs \"model\": the draft model")
        if method == "ngram" and data.get("model"):
            raise SpeculativeConfigError("method \"ngram\" takes no \"model\"")
        k = _int(data, "num_speculative_tokens", None, 1, MAX_SPECULATIVE_TOKENS)
        high = _int(data, "prompt_lookup_max", DEFAULT_PROMPT_LOOKUP_MAX, 1, MAX_PROMPT_LOOKUP)
        low = _int(data, "prompt_lookup_min", min(DEFAULT_PROMPT_LOOKUP_MIN, high), 1, high)
        off = data.get("disable_by_batch_size")
        if off is not None:
            off = _int(data, "disable_by_batch_size", None, 0, None, " (0: never)")
        return cls(method, k, high, low, data.get("model"), off)

    def on_device(self, device_type: str) -> SpeculativeConfig:
        """This configuration with disable_by_batch_size resolved for the device type."""
        if self.disable_by_batch_size is not None:
            return self
        default = DEFAULT_DISABLE_BY_BATCH_SIZE.get(device_type, 0)
        return dataclasses.replace(self, disable_by_batch_size=default)


def _int(data: dict[str, Any], key: str, default: int | None, low: int,
         high: int | None, meaning: str = "") -> int:
    value = data.get(key, default)
    if value is None:
        raise SpeculativeConfigError(f"{key!r} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpeculativeConfigError(f"{key!r} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise SpeculativeConfigError(f"{key!r} must be in {bounds}{meaning}, got {value}")
    return value
