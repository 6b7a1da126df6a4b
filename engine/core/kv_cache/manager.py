"""Per-sequence block tables over the allocator: growth, sharing, copy-on-write, prefix reuse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenmill.engine.core.kv_cache.block_allocator import BlockAllocator
from tokenmill.engine.core.kv_cache.host_tier import HostTier
from tokenmill.engine.core.kv_cache.prefix_cache import PrefixCache, PrefixMatch
from tokenmill.engine.core.kv_cache.state_checkpoints import StateCheckpoints
from tokenmill.engine.core.kv_cache.state_slots import StateSlots
from tokenmill.engine.core.prompt_logprobs import needs_scoring
from tokenmill.engine.core.request import Sequence
from tokenmill.engine.execution.step_inputs import slot_index

if TYPE_CHECKING:
    from tokenmill.engine.execution.kv_layout import KVCacheLayout

GIB = 1 << 30


@dataclass(frozen=True)
class KVCacheStats:
    num_blocks: int
    used_blocks: int
    allocated_slots: int
    used_slots: int | None  # None: not counted (stats(slots=False))
    cached_blocks: int = 0
    evictable_blocks: int = 0
    host_blocks: int = 0       # the host tier's size (0: no tier)
    host_used_blocks: int = 0  # of those, holding an evicted prefix block
    dtype: str | None = None              # storage of K/V values: float32, int8, float8_e4m3fn
    bytes_per_token: int | None = None    # K and V of every layer, scales included

    @property
    def tokens_per_gib(self) -> float | None:
        """How many tokens' KV one GiB of pool holds: the gain of a smaller KV dtype."""
        return GIB / self.bytes_per_token if self.bytes_per_token else None

    @property
    def usage(self) -> float:
        """Fraction of the pool's blocks held by sequences."""
        return self.used_blocks / self.num_blocks

    @property
    def waste(self) -> float | None:
        """Allocated but unused slots as a fraction of allocated slots (PagedAttention's metric);
        None where the used slots were not counted."""
        if self.used_slots is None:
            return None
        if self.allocated_slots == 0:
            return 0.0
        return (self.allocated_slots - self.used_slots) / self.allocated_slots


class KVCacheManager:
    """Owns which blocks each sequence's tokens occupy. Tensors live in the model runner."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 layout: KVCacheLayout | None = None, num_host_blocks: int = 0,
                 state_slots: int = 0, checkpoint_slots: int = 0):
        """`state_slots`: recurrent-state slots of a model with linear-attention layers (one
        per sequence it may run), 0 for any other; `checkpoint_slots`: the slots after them,
        which hold the states the prefix cache keeps (state_checkpoints.py)."""
        self.block_size = block_size
        self.states = StateSlots(state_slots) if state_slots else None
        self.layout = layout  # the pool's storage, reported in stats()
        self.allocator = BlockAllocator(num_blocks)
        # The host tier holds what the prefix cache evicts: without the cache it has no use.
        self.host = HostTier(num_host_blocks) if num_host_blocks and enable_prefix_caching \
            else None
        self.prefix_cache = PrefixCache(self.allocator, block_size, self.host) \
            if enable_prefix_caching else None
        self.checkpoints = StateCheckpoints(state_slots, checkpoint_slots, block_size,
                                            self.prefix_cache.node_of) \
            if self.prefix_cache is not None and state_slots and checkpoint_slots else None
        self._tables: dict[int, Sequence] = {}
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0     # of those, tokens found (on the device or in the host tier)
        self.host_prefix_hits = 0  # of those, tokens found in the host tier

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- admission with prefix reuse ------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> PrefixMatch:
        """Cached blocks seq can start from. The last token is always recomputed: its logits
        are needed to sample the next one; a prompt still to be scored is computed whole."""
        if (self.prefix_cache is None or seq.num_computed_tokens or seq.block_table
                or needs_scoring(seq)):
            return PrefixMatch()
        found = self.prefix_cache.match(seq.cache_token_ids()[:seq.num_tokens - 1],
                                        seq.cache_salt)
        if self.states is None:
            return found
        # Recurrent layers resume only where a state is kept: the prefix is cut there.
        kept = self.checkpoints.find(found.nodes) if self.checkpoints is not None else None
        if kept is None:
            return found.cut(0)
        cached = found.cut(kept[0])
        cached.restore_slot = kept[1]
        return cached

    def can_admit(self, seq: Sequence, cached: PrefixMatch, num_new_tokens: int) -> bool:
        """Blocks for the new tokens and for the host-tier blocks copied back all fit."""
        start = cached.num_blocks * self.block_size
        new_blocks = self.blocks_needed(start + num_new_tokens) - len(cached.device)
        revived = sum(1 for b in cached.device if self.allocator.ref_count(b) == 0)
        if self.states is not None and not self.states.num_free:
            return False
        return new_blocks + revived <= self.allocator.num_free

    def admit(self, seq: Sequence, cached: PrefixMatch | list[int]) -> None:
        """Start seq from its cached prefix: device blocks shared, host-tier blocks copied
        into fresh device blocks before the step runs (take_transfers())."""
        if isinstance(cached, list):
            cached = PrefixMatch(cached)
        for block in cached.device:
            self.allocator.share(block)
        seq.block_table = list(cached.device)
        if cached.host:
            for host_block in cached.host:  # an allocation below may offload: never into these
                self.host.pin(host_block)
            for host_block in cached.host:
                block = self.allocator.allocate()
                self.prefix_cache.adopt(block, self.host.load(host_block, block))
                seq.block_table.append(block)
        seq.num_computed_tokens = cached.num_blocks * self.block_size
        seq.num_cached_blocks = cached.num_blocks
        seq.cached_prefix = cached.last
        if self.states is not None:
            seq.state_slot = self.states.acquire()
            if cached.restore_slot >= 0:
                self.checkpoints.restore(cached.restore_slot, seq.state_slot)
        if self.prefix_cache is not None:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed_tokens
            self.host_prefix_hits += len(cached.host) * self.block_size
        self._tables[seq.seq_id] = seq

    def take_transfers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The (device, host) block copies to host and to device queued since the last call;
        they must run before the next forward pass writes the pool."""
        return self.host.take_copies() if self.host is not None else ([], [])

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Index seq's blocks that became full and computed, so later requests can reuse them."""
        full = seq.num_computed_tokens // self.block_size
        if self.prefix_cache is None or full <= seq.num_cached_blocks:
            return
        tokens = seq.cache_token_ids()
        bs = self.block_size
        for i in range(seq.num_cached_blocks, full):
            seq.cached_prefix = self.prefix_cache.insert(
                seq.block_table[i], tuple(tokens[i * bs:(i + 1) * bs]), seq.cache_salt,
                seq.cached_prefix)
        seq.num_cached_blocks = max(seq.num_cached_blocks, full)

    # ---- growth, forks, release -----------------------------------------------------------

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks to allocate so seq's next `num_new_tokens` have slots, copy-on-write included."""
        total = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        new = max(0, total - len(seq.block_table))
        if not self.allocator.num_shared:  # no block to copy before writing (every decode's case)
            return new
        first = seq.num_computed_tokens // self.block_size
        if first < len(seq.block_table) and self.allocator.ref_count(seq.block_table[first]) > 1:
            new += 1
        return new

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= self.allocator.num_free

    def grow(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Give seq slots for its next tokens. Returns (src, dst) block copies to perform first.

        A block shared with another sequence is copied before this one writes into it.
        Call only after can_grow() said yes.
        """
        copies = []
        first = seq.num_computed_tokens // self.block_size
        if first < len(seq.block_table):
            shared = seq.block_table[first]
            if self.allocator.ref_count(shared) > 1:
                fresh = self.allocator.allocate()
                self.allocator.release(shared)
                seq.block_table[first] = fresh
                copies.append((shared, fresh))
        total = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        while len(seq.block_table) < total:
            seq.block_table.append(self.allocator.allocate())
        self._tables[seq.seq_id] = seq
        return copies

    def trim(self, seq: Sequence) -> None:
        """Release blocks past seq's tokens: those grown for proposals it did not accept (their
        slots hold KV of rejected tokens, never read again)."""
        keep = self.blocks_needed(seq.num_tokens)
        while len(seq.block_table) > keep:
            self.allocator.release(seq.block_table.pop())

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Child shares every block of parent (reference counts, no copy)."""
        for block in parent.block_table:
            self.allocator.share(block)
        child.block_table = list(parent.block_table)
        child.num_cached_blocks = parent.num_cached_blocks
        child.cached_prefix = parent.cached_prefix
        if self.states is not None:
            child.state_slot = self.states.fork(parent.state_slot)
        self._tables[child.seq_id] = child

    def take_state_copies(self) -> list[tuple[int, int]]:
        """Recurrent-state copies (source slot, destination slot) to run before the step
        being handed out: into forks, from checkpoints into the sequences resuming from them,
        into checkpoints (state_checkpoints.py). One batch: every copy reads the slots as
        they were before it."""
        if self.states is None:
            return []
        copies = self.states.take_copies()
        return copies + self.checkpoints.take_copies() if self.checkpoints else copies

    # ---- checkpoints of recurrent states --------------------------------------------------

    def checkpoint_cut(self, seq: Sequence, start: int) -> int | None:
        """The first point past `start` where seq's state is to be kept: the junction (where
        the prefix found cached for it ended), then its last block boundary; None where
        the model keeps no checkpoints or seq reaches neither."""
        if self.checkpoints is None:
            return None
        last = (seq.num_tokens - 1) // self.block_size * self.block_size
        cuts = [cut for cut in (seq.state_junction, last) if cut > start]
        return min(cuts) if cuts else None

    def keep_state(self, seq: Sequence, start: int, num_new: int) -> None:
        """After scheduling seq's next `num_new` tokens from `start`: keep its state where
        they end at its checkpoint cut."""
        end = start + num_new
        if self.checkpoints is None or end != self.checkpoint_cut(seq, start):
            return
        # At the junction the prefix is cached: another sequence may be keeping it already.
        node = self.prefix_cache.node_of(seq.cache_token_ids()[:end], seq.cache_salt) \
            if end == seq.state_junction else None
        self.checkpoints.save(seq, end, node)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix and kept state. Only while no sequence holds a block."""
        if self.prefix_cache is not None:
            self.prefix_cache.reset()
        if self.checkpoints is not None:
            self.checkpoints.clear()

    def free(self, seq: Sequence) -> None:
        for block in reversed(seq.block_table):
            self.allocator.release(block)
        seq.block_table = []
        seq.num_cached_blocks = 0
        seq.cached_prefix = None
        if self.states is not None and seq.state_slot >= 0:
            self.states.release(seq.state_slot)
            seq.state_slot = -1
        self._tables.pop(seq.seq_id, None)

    def slot(self, seq: Sequence, position: int) -> int:
        return slot_index(seq.block_table, position, self.block_size)

    def stats(self, slots: bool = True) -> KVCacheStats:
        """The pool's counts. slots=False leaves the used slots (and so the waste) uncounted:
        where blocks are shared, counting them walks every block of every table, which at a
        large batch costs a good part of a decode step; everything else is a counter."""
        return KVCacheStats(
            num_blocks=self.allocator.num_blocks,
            used_blocks=self.allocator.num_used,
            allocated_slots=self.allocator.num_used * self.block_size,
            used_slots=self._used_slots() if slots else None,
            cached_blocks=self.allocator.num_cached,
            evictable_blocks=self.allocator.num_evictable,
            host_blocks=self.host.num_blocks if self.host else 0,
            host_used_blocks=self.host.num_used if self.host else 0,
            dtype=self.layout.dtype_name if self.layout else None,
            bytes_per_token=self.layout.bytes_per_token if self.layout else None,
        )

    def _used_slots(self) -> int:
        """Slots holding a computed token, each shared block counted once. Where no block is
        shared, a table's slots are its computed tokens (capped at its blocks' room)."""
        if self.allocator.num_shared == 0:
            size = self.block_size
            return sum(min(seq.num_computed_tokens, len(seq.block_table) * size)
                       for seq in self._tables.values())
        owners: dict[int, int] = {}
        for seq in self._tables.values():
            for i, block in enumerate(seq.block_table):
                filled = min(self.block_size, max(0, seq.num_computed_tokens - i * self.block_size))
                owners[block] = max(owners.get(block, 0), filled)
        return sum(owners.values())
