"""The quantization modes the benchmarks compare with the unquantized engine."""

from __future__ import annotations

from typing import Any

# Each mode's engine options on top of the command's flags and the reference's. The reference
# is float32 with nothing quantized (a GGUF file dequantized), whatever the defaults pick.
MODES: dict[str, dict[str, Any]] = {
    "bf16": {"dtype": "bfloat16"},
    "gguf": {"quantization": "gguf"},
    "int8": {"quantization": "int8"},
    "fp8": {"quantization": "fp8"},
    "kv-int8": {"kv_cache_dtype": "int8"},
    "kv-fp8": {"kv_cache_dtype": "fp8"},
    "kv-fp8-e5m2": {"kv_cache_dtype": "fp8_e5m2"},
    "int8+kv-int8": {"quantization": "int8", "kv_cache_dtype": "int8"},
    "fp8+kv-fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
}
REFERENCE_NAME = "unquantized"
REFERENCE: dict[str, Any] = {"quantization": "none", "kv_cache_dtype": "auto",
                             "dtype": "float32"}


def parse_modes(text: str) -> list[str]:
    """'int8,kv-int8' -> ['int8', 'kv-int8']; ValueError naming unknown ones."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown quantization modes {unknown}; known: {list(MODES)}")
    return modes
