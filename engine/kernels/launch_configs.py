"""Launch settings measured per GPU model, read once per device.

The block sizes, warps and pipeline stages that run a kernel fastest differ between GPUs and
between shapes. `tokenmill bench gpu kernels` measures candidates on one GPU and writes the
fastest correct ones as `configs/<gpu>.json` (the GPU's name in lower case, words joined by
"-", e.g. `nvidia-h200.json`). A kernel takes its entry for the shape at hand, else the
file's "*" entry for it, else its own defaults: on CPUs and on GPUs without a file nothing
changes. TOKENMILL_KERNEL_CONFIGS names a file to use in place of the packaged one (a sweep's
output, tried before it is committed).

File layout: {"<kernel>": {"<shape key>": {"<setting>": value, ...}, "*": {...}}}.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

CONFIG_DIR = Path(__file__).parent / "configs"
ENV_VAR = "TOKENMILL_KERNEL_CONFIGS"

# Each kernel's settings where no file has an entry; here, not beside the kernels, so that
# reading them defines no Triton kernel (a kernel reads TRITON_INTERPRET once, when defined).
KERNEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "weight_only_matmul": {
        "block_n": 16,   # output channels per program: at 4,096 outputs, 256 programs
        "block_k": 256,
        "split_k": 1,
        "rowwise": False,
        "num_warps": 4,
        "num_stages": 3,
    },
    "prefill_attention": {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3},
    "decode_attention": {"block_n": 64, "num_warps": 4, "num_stages": 3},
}


def weight_key(rows: int, outputs: int, inner: int) -> str:
    """The weight-only matmul's key: the weight's shape, and one row or a block of them."""
    return f"{outputs}x{inner}:{'m1' if rows == 1 else 'm16'}"


def attention_key(q: torch.Tensor, k_cache: torch.Tensor, group: int) -> str:
    """The attention kernels' key: query dtype, cache dtype, head size and query heads per
    K/V head (what their tiles' shapes and loads depend on)."""
    return (f"{str(q.dtype).removeprefix('torch.')}:{str(k_cache.dtype).removeprefix('torch.')}"
            f":d{q.shape[-1]}:g{group}")


def device_slug(device: torch.device) -> str:
    """The file name's stem for this device: "nvidia-h200" for an "NVIDIA H200", "cpu"."""
    if device.type != "cuda":
        return device.type
    return _cuda_slug(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_slug(index: int) -> str:
    return slug(torch.cuda.get_device_name(index))


def slug(name: str) -> str:
    """A device name as a file name: lower case, words joined by "-"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def launch_config(kernel: str, key: str, device: torch.device,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The kernel's KERNEL_DEFAULTS, with the measured settings for (kernel, shape key) on this
    device laid over them, then the caller's overrides. Only settings the defaults name are
    taken from the file, so an older file cannot pass a kernel an argument it no longer has;
    an override they do not name is a caller's mistake, and raises. The answer is kept per
    kernel, shape and device (kernels launch every layer of every step): do not change it."""
    defaults = KERNEL_DEFAULTS[kernel]
    found_key = (kernel, key, device.type, device.index, os.environ.get(ENV_VAR))
    config = _resolved.get(found_key)
    if config is None:
        entries = _table(_path(device)).get(kernel, {})
        found = entries.get(key, entries.get("*")) or {}
        config = {**defaults, **{name: v for name, v in found.items() if name in defaults}}
        _resolved[found_key] = config
    if not overrides:
        return config
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise TypeError(f"{kernel} has no launch setting {', '.join(sorted(unknown))}")
    return {**config, **overrides}


_resolved: dict[tuple[Any, ...], dict[str, Any]] = {}


def source(device: torch.device) -> str | None:
    """The file the kernels on this device take their settings from; None: their defaults."""
    path = _path(device)
    return path if Path(path).is_file() else None


def _path(device: torch.device) -> str:
    return os.environ.get(ENV_VAR) or str(CONFIG_DIR / f"{device_slug(device)}.json")


@functools.cache
def _table(path: str) -> dict[str, dict[str, dict[str, Any]]]:
    file = Path(path)
    if not file.is_file():
        return {}
    try:
        table = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"kernel launch configs {path}: {error}") from error
    if not isinstance(table, dict) or not all(
            isinstance(entries, dict) and all(isinstance(v, dict) for v in entries.values())
            for entries in table.values()):
        raise ValueError(f"kernel launch configs {path}: expected "
                         '{"kernel": {"shape": {"setting": value}}}')
    return table


def clear_cache() -> None:
    """Forget the files read (a test or a sweep that writes a new one)."""
    _table.cache_clear()
    _resolved.clear()
