"""Host tier: prefix-cache blocks evicted from the device pool, kept in host memory.

Only the bookkeeping lives here; the tensors are the execution layer's (kv_offload.py). When
the device pool evicts a cached block, its entry moves here and a device-to-host copy is
queued; a prompt whose prefix match reaches these blocks gets them copied back into fresh
device blocks instead of recomputing them. The tier evicts its own least recently used
entries. The copies queued while a step is scheduled run before that step's forward pass;
until then the host blocks they touch are pinned, so a block is never reused while a copy of
the same step still reads or writes it.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from tokenmill.engine.core.kv_cache.prefix_cache import CachedBlock, confirmed, unindex


class HostTier:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError("the host tier needs at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._entries: dict[int, CachedBlock] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._by_key: dict[int, list[int]] = {}
        self._by_node: dict[int, int] = {}
        self._pinned: set[int] = set()
        self._to_host: list[tuple[int, int]] = []    # (device block, host block)
        self._to_device: list[tuple[int, int]] = []  # (device block, host block)
        self.blocks_offloaded = 0  # device-to-host block copies, ever
        self.blocks_loaded = 0     # host-to-device block copies, ever

    @property
    def num_used(self) -> int:
        return len(self._entries)

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    def entry(self, block: int) -> CachedBlock:
        return self._entries[block]

    def find(self, key: int, tokens: tuple[int, ...], salt: str | None,
             parent: int) -> int | None:
        """The host block holding exactly this prefix block (see prefix_cache.py), if any."""
        return confirmed(self._by_key.get(key, ()), self._entries, tokens, salt, parent)

    def offload(self, device_block: int, entry: CachedBlock) -> None:
        """The device is evicting `device_block` (holding `entry`): keep a copy here, unless
        one is here already or every host block is pinned by this step."""
        held = self._by_node.get(entry.node)
        if held is not None:
            self._lru.move_to_end(held)
            return
        block = self._take()
        if block is None:
            return
        self._entries[block] = entry
        self._lru[block] = None
        self._by_key.setdefault(entry.key, []).append(block)
        self._by_node[entry.node] = block
        self._pinned.add(block)
        self._to_host.append((device_block, block))
        self.blocks_offloaded += 1

    def pin(self, block: int) -> None:
        """Keep a matched block from eviction until this step's copies are taken."""
        self._pinned.add(block)

    def load(self, block: int, device_block: int) -> CachedBlock:
        """Queue the copy of host `block` into `device_block`; return its entry."""
        self._pinned.add(block)
        self._lru.move_to_end(block)
        self._to_device.append((device_block, block))
        self.blocks_loaded += 1
        return self._entries[block]

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This step's (device, host) copies to host and to device; unpins every block."""
        copies = (self._to_host, self._to_device)
        self._to_host, self._to_device = [], []
        self._pinned.clear()
        return copies

    def check_consistent(self) -> None:
        """Raise if a block is pinned between steps or lost (the no-leak invariant)."""
        if self._pinned or self._to_host or self._to_device:
            raise AssertionError(f"{len(self._pinned)} host blocks pinned between steps")
        if len(self._free) + len(self._entries) != self.num_blocks:
            raise AssertionError(f"host tier: {len(self._free)} free + {len(self._entries)} "
                                 f"used != {self.num_blocks} blocks")

    def clear(self) -> None:
        """Drop every block it holds (none may be pinned: nothing is being loaded)."""
        for block in list(self._lru):
            self._drop(block)
            self._free.append(block)

    def _take(self) -> int | None:
        if self._free:
            return self._free.popleft()
        for block in self._lru:
            if block not in self._pinned:
                self._drop(block)
                return block
        return None

    def _drop(self, block: int) -> None:
        entry = self._entries.pop(block)
        del self._lru[block]
        del self._by_node[entry.node]
        unindex(self._by_key, entry.key, block)
