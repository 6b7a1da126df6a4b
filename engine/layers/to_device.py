"""Small host data onto the device without waiting for the work queued there.

On CUDA a copy from pageable host memory synchronizes: torch stages it and waits for the
stream, so the host stops until every kernel queued before the copy has run. Under async
scheduling the host builds a step's indices (logit rows, sampling settings, penalties) while
the device still computes the step before; one such wait takes that overlap away. A copy
from pinned memory with `non_blocking` is queued like a kernel instead (torch keeps the pinned
buffer alive until the copy has run).
"""

from __future__ import annotations

from typing import Any

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, queued behind the device's work rather than waiting for it."""
    if device.type != "cuda":
        return host.to(device)
    if not host.is_pinned():
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def list_to_device(values: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.tensor(values, dtype=dtype, device=device), without waiting on CUDA."""
    cuda = device.type == "cuda"
    return to_device(torch.tensor(values, dtype=dtype, pin_memory=cuda), device)
