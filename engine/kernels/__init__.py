"""Triton kernels for attention over the paged KV cache.

Leaves of the engine: tensors in, tensors out. The torch ops in `layers/paged_attention.py` are
their oracle and the CPU path. Importing this package does not import triton; the kernel
modules do, so only import them once `triton_available()` says so.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """Whether triton is installed (plain CPU installs of the engine go without it)."""
    return importlib.util.find_spec("triton") is not None
