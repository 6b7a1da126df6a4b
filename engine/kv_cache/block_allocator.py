"""Block allocator: a free list plus reference counts, so blocks can be shared (n > 1, forks)."""

from __future__ import annotations

from collections import deque


class OutOfBlocks(RuntimeError):
    """The pool has no free block; the scheduler answers by preempting."""


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError("the KV-cache pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free KV-cache block")
        block = self._free.popleft()
        self._ref_counts[block] = 1
        return block

    def share(self, block: int) -> None:
        """Add a reference to a block that is already in use."""
        if self._ref_counts[block] < 1:
            raise ValueError(f"block {block} is free and cannot be shared")
        self._ref_counts[block] += 1

    def release(self, block: int) -> None:
        """Drop one reference; the block returns to the free list when none is left."""
        if self._ref_counts[block] < 1:
            raise ValueError(f"block {block} is already free")
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            self._free.append(block)

    def check_all_free(self) -> None:
        """Raise if any block is still referenced (the no-leak invariant after a run)."""
        held = [b for b, count in enumerate(self._ref_counts) if count]
        if held or len(self._free) != self.num_blocks:
            raise AssertionError(f"{len(held)} KV blocks still referenced: {held[:10]}")
