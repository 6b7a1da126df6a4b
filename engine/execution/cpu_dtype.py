"""The CPU's default model dtype: bfloat16 where the cores compute it natively, else float32;
float32 for a GGUF file's quantized weights whatever the cores.

With native bfloat16 (x86 AVX512-BF16 or AMX, Arm BF16) the matmuls read half the bytes of
float32 at full speed. Elsewhere torch emulates bfloat16 arithmetic, and float32 keeps the
reference's precision; the quantized CPU kernels convert activations to bfloat16 themselves
where that is what makes them fast. A GGUF file's weights are already quantized: the kernels
that keep them take bfloat16 inside the matmuls anyway, and bfloat16 everywhere else would add
its rounding to the file's (on the embedded 4-bit SmolLM2 the two together turn the greedy
answer to a plain question into another language).

TOKENMILL_CPU_DTYPE (float32, bfloat16 or float16) overrides the choice for every engine a
process and its children start: one setting for a fleet of mixed CPUs, or float32 everywhere
where outputs must match a float32 reference.
"""

from __future__ import annotations

import os

import torch

from tokenmill.engine.contract.config import ConfigError

ENV = "TOKENMILL_CPU_DTYPE"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags the kernel reports for the first core (x86 `flags`, Arm
    `Features`); empty where there is no /proc/cpuinfo."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool(NATIVE_BF16_FLAGS & (cpu_flags() if flags is None else flags))


def default_cpu_dtype(flags: frozenset[str] | None = None,
                      quantized_file: bool = False) -> torch.dtype:
    """TOKENMILL_CPU_DTYPE where set (and no flags are given), else float32 for a GGUF file's
    quantized weights (`quantized_file`), else by the cores' flags."""
    chosen = os.environ.get(ENV) if flags is None else None
    if chosen:
        if chosen not in DTYPES:
            raise ConfigError("dtype", f"{ENV}={chosen!r} is not one of {', '.join(DTYPES)}")
        return DTYPES[chosen]
    return torch.bfloat16 if native_bf16(flags) and not quantized_file else torch.float32
