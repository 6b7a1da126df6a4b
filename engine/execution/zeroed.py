"""Zeroed tensors that cost host memory only where they are written.

torch.zeros on the host writes every byte, so a CPU engine's KV pool (1 GiB by default)
takes all of it from the start however little a model uses. Pages of an anonymous mapping
come from the kernel already zeroed, on first touch: the pool is still all zeros to read,
and memory is committed as blocks fill."""

from __future__ import annotations

import math
import mmap

import torch


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros(shape, dtype, device), lazily committed where the device is the host."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    # The tensor holds a reference to the mapping; the mapping goes when the tensor does.
    pages = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)
    return pages.view(dtype).view(shape)
