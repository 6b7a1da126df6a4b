"""Token masks as bitmasks: the constrained rows of a batch get -inf outside their allowed set.

Matchers write int32 words on the host (bit i of word w allows token 32 * w + i); one copy takes
the batch's words to the logits' device (pinned and asynchronous on CUDA, so it waits for
nothing queued before it), where they are unpacked and applied to the constrained rows in one
masked_fill. Unconstrained rows are not touched.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def fill(matchers: Seq[Any], vocab_size: int, device: torch.device) -> torch.Tensor:
    """The host bitmask of these matchers, one row each."""
    bitmask = torch.empty((len(matchers), words(vocab_size)), dtype=torch.int32,
                          pin_memory=device.type == "cuda")
    for row, matcher in enumerate(matchers):
        matcher.fill_bitmask(bitmask, row)
    return bitmask


def apply(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """In place: logits[rows[j]] keeps only the tokens bitmask[j] allows."""
    device = logits.device
    vocab = logits.shape[1]
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    packed = to_device(bitmask, device)
    allowed = ((packed.unsqueeze(-1) >> shifts) & 1).view(len(rows), -1)[:, :vocab].bool()
    if len(rows) == logits.shape[0]:
        logits.masked_fill_(~allowed, float("-inf"))
        return
    index = to_device(torch.tensor(rows), device)
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(~allowed,
                                                                            float("-inf")))


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the work queued there: on CUDA it is
    copied from pinned memory, asynchronously (a pageable copy would synchronize)."""
    if device.type != "cuda":
        return host
    if not host.is_pinned():
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
