"""Device memory bandwidth: the denominator of the decode-step bound.

A decode step reads every weight and the KV cache once, so it cannot take less than those
bytes over what the memory delivers. That rate is measured the way the GPU notes state theirs:
one large tensor copied into another, bytes read plus bytes written over the time, after a
warm-up, the best of a few repetitions (the bound is a floor, so it divides by the fastest
rate seen; the median is kept beside it). The buffers are far larger than any cache.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

GB = 1e9                          # bandwidths are in decimal GB/s, as vendors and tools state them
MIB = 1 << 20
CPU_COPY_BYTES = 256 * MIB        # well past a server CPU's last-level cache, quick on 2 cores
CUDA_COPY_BYTES = 1024 * MIB      # 20x an H100's 50 MB L2
CUDA_COPIES_PER_REPEAT = 10       # one 1 GiB copy is ~0.7 ms at 3 TB/s: time several together
MIN_COPY_BYTES = 64 * MIB


@dataclass(frozen=True)
class Bandwidth:
    """What the bound divides by, and where the figure came from."""

    gb_per_s: float                        # best repetition, or the figure given
    source: str                            # "measured" or "given"
    device: str | None = None
    median_gb_per_s: float | None = None
    copy_bytes: int | None = None          # size of one buffer (each copy reads and writes it)
    repeats: int = 0

    def seconds_for(self, num_bytes: float) -> float:
        """Time to move num_bytes at this rate."""
        return num_bytes / (self.gb_per_s * GB)


def given_bandwidth(gb_per_s: float) -> Bandwidth:
    if gb_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {gb_per_s}")
    return Bandwidth(gb_per_s, "given")


def measure_bandwidth(device: Any, copy_bytes: int | None = None,
                      repeats: int = 5) -> Bandwidth:
    """Copy a buffer of copy_bytes (default sized for the device type) `repeats` times after one
    untimed copy; on CUDA, halve the buffer until it fits next to what is already allocated."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    size = copy_bytes or (CUDA_COPY_BYTES if cuda else CPU_COPY_BYTES)
    while True:
        try:
            src = torch.ones(size, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            break
        except torch.OutOfMemoryError:
            if not cuda or size // 2 < MIN_COPY_BYTES:
                raise
            size //= 2
    copies = CUDA_COPIES_PER_REPEAT if cuda else 1
    rates = []
    for attempt in range(repeats + 1):
        seconds = _time_copies(dst, src, copies, cuda)
        if attempt:  # the first one is the warm-up
            rates.append(2 * size * copies / seconds / GB)
    del src, dst
    return Bandwidth(max(rates), "measured", str(device), statistics.median(rates), size,
                     repeats)


def _time_copies(dst: Any, src: Any, copies: int, cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize(src.device)
    start = time.perf_counter()
    for _ in range(copies):
        dst.copy_(src)
    if cuda:
        torch.cuda.synchronize(src.device)
    return time.perf_counter() - start
