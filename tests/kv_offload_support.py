"""Random steps of KV host-tier copies, shared by the CPU and the CUDA tests of the tier."""

from __future__ import annotations

import random

Transfers = list[tuple[int, int]]  # (device block, host block)


def random_transfers(rng: random.Random, num_blocks: int, host_blocks: int,
                     most: int) -> tuple[Transfers, Transfers]:
    """One step's copies to host and to device, at most `most` each way; where both have
    some, a block offloaded is loaded into in the same step (the allocator may hand it out
    again at once)."""
    k = rng.randint(0, most)
    to_host = list(zip(rng.sample(range(num_blocks), k), rng.sample(range(host_blocks), k),
                       strict=True))
    k = rng.randint(0, most)
    targets = rng.sample(range(num_blocks), k)
    if to_host and targets and to_host[0][0] not in targets:
        targets[0] = to_host[0][0]
    return to_host, list(zip(targets, rng.sample(range(host_blocks), k), strict=True))
