"""Block allocator: a free list, reference counts, and an LRU of cached blocks nobody holds.

Reference counts let sequences share blocks (n > 1 samples, cached prefixes). A block whose
count drops to zero goes back to the free list, unless the prefix cache holds its contents:
then it waits in the evictable LRU, still reusable, until an allocation needs the space.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable


class OutOfBlocks(RuntimeError):
    """The pool has no free block; the scheduler answers by preempting."""


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError("the KV-cache pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks
        self._cached: set[int] = set()
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.on_evict: Callable[[int], None] | None = None
        # Blocks held more than once: at 0 the manager skips its copy-on-write test and counts
        # used slots per table instead of per block.
        self.num_shared = 0

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)  # least recently used
            self._cached.discard(block)
            if self.on_evict is not None:
                self.on_evict(block)
        else:
            raise OutOfBlocks("no free KV-cache block")
        self._ref_counts[block] = 1
        return block

    def share(self, block: int) -> None:
        """Add a reference to a block in use, or revive an evictable cached one."""
        if self._ref_counts[block] == 0:
            if block not in self._evictable:
                raise ValueError(f"block {block} is free and cannot be shared")
            del self._evictable[block]
        self._ref_counts[block] += 1
        if self._ref_counts[block] == 2:
            self.num_shared += 1

    def release(self, block: int) -> None:
        """Drop one reference; at zero the block is freed, or kept as evictable if cached."""
        if self._ref_counts[block] < 1:
            raise ValueError(f"block {block} is already free")
        if self._ref_counts[block] == 2:
            self.num_shared -= 1
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            if block in self._cached:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def forget_cached(self) -> None:
        """No block holds reusable contents any more: the evictable ones are free again,
        without the eviction callback (nothing is offloaded)."""
        self._free.extend(self._evictable)
        self._evictable.clear()
        self._cached.clear()

    def mark_cached(self, block: int) -> None:
        """The prefix cache now indexes this (held) block's contents."""
        self._cached.add(block)

    def check_all_free(self) -> None:
        """Raise if any block is still referenced (the no-leak invariant after a run)."""
        if not any(self._ref_counts) and self.num_free == self.num_blocks:
            return
        held = [b for b, count in enumerate(self._ref_counts) if count]
        raise AssertionError(f"{len(held)} KV blocks still referenced: {held[:10]}")
