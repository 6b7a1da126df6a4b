"""Seconds of each start-up phase, taken where the phase runs, so that the engine's start-up
report says where start-up time goes (loading weights, sizing the KV pool, capturing graphs).

On CUDA a phase ends with a synchronize: device work a phase queued (filling the pool with
zeros, the last weight copies) is counted in it, not in the next one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class StartupPhases:
    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the block (its device work included) to `seconds[name]`."""
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
