"""Prefix cache: full KV blocks indexed by the exact token prefix that produced them.

Chained block hashes (as in vLLM) rather than a radix tree (as in SGLang): a block's key is
hash(parent's key, its tokens, cache salt), so a lookup is one dictionary probe per block and
the cache is a flat map beside the allocator, with no tree to keep balanced on eviction. The
hash only finds candidates. Every cached prefix also gets a node id, never reused; a candidate
is used only if its stored tokens and salt equal ours and its parent's node is exactly the
node we matched just before, so by induction the whole prefix is confirmed token for token and
a hash collision can never serve another prompt's KV.

With a host tier (host_tier.py), a block evicted from the device keeps its entry, node id
included, in host memory; a match continues there where the device's cached blocks end.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenmill.engine.core.kv_cache.block_allocator import BlockAllocator

if TYPE_CHECKING:
    from tokenmill.engine.core.kv_cache.host_tier import HostTier

NO_PARENT = -1


@dataclass(frozen=True)
class CachedBlock:
    key: int
    tokens: tuple[int, ...]
    salt: str | None
    parent: int  # node of the preceding block, NO_PARENT for a prompt's first block
    node: int    # this exact prefix; it follows the contents from one tier to the other


@dataclass
class PrefixMatch:
    """A prompt's cached prefix: device blocks first, then host-tier blocks to copy back,
    and each block's node. For a model with recurrent states it is cut to the longest prefix
    whose state is kept (state_checkpoints.py): `restore_slot` holds that state (-1: none),
    `junction` is how many blocks were found before the cut."""

    device: list[int] = field(default_factory=list)
    host: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    restore_slot: int = -1
    junction: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.device) + len(self.host)

    def cut(self, num_blocks: int) -> PrefixMatch:
        """The first `num_blocks` blocks, the junction where this match ended."""
        device = self.device[:num_blocks]
        return PrefixMatch(device, self.host[:num_blocks - len(device)],
                           self.nodes[:num_blocks], self.keys[:num_blocks],
                           junction=self.num_blocks)

    @property
    def last(self) -> tuple[int, int] | None:
        """(key, node) of the prefix's last block, None for an empty match."""
        return (self.keys[-1], self.nodes[-1]) if self.nodes else None


def confirmed(candidates: Iterable[int], entries: Mapping[int, CachedBlock],
              tokens: tuple[int, ...], salt: str | None, parent: int) -> int | None:
    """The first candidate block whose entry holds exactly these tokens after `parent`."""
    for block in candidates:
        info = entries[block]
        if info.tokens == tokens and info.salt == salt and info.parent == parent:
            return block
    return None


def unindex(by_key: dict[int, list[int]], key: int, block: int) -> None:
    """Remove `block` from its key's candidates, and the key once it has none."""
    same_key = by_key[key]
    same_key.remove(block)
    if not same_key:
        del by_key[key]


class PrefixCache:
    def __init__(self, allocator: BlockAllocator, block_size: int, host: HostTier | None = None):
        self.allocator = allocator
        self.block_size = block_size
        self.host = host
        self._by_key: dict[int, list[int]] = {}
        self._blocks: dict[int, CachedBlock] = {}
        self._nodes = itertools.count()
        allocator.on_evict = self._forget

    @staticmethod
    def block_key(parent_key: int, tokens: tuple[int, ...], salt: str | None) -> int:
        """Candidate key of a block; collisions are harmless (see the module docstring)."""
        return hash((parent_key, tokens, salt))

    def match(self, token_ids: list[int], salt: str | None) -> PrefixMatch:
        """Cached blocks holding the longest prefix of token_ids, in order: on the device while
        they last, then in the host tier."""
        found = PrefixMatch()
        parent, parent_key = NO_PARENT, 0
        bs = self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            tokens = tuple(token_ids[start:start + bs])
            key = self.block_key(parent_key, tokens, salt)
            block = None if found.host else self._confirmed(key, tokens, salt, parent)
            if block is not None:
                found.device.append(block)
                parent = self._blocks[block].node
            else:
                host_block = (self.host.find(key, tokens, salt, parent)
                              if self.host is not None else None)
                if host_block is None:
                    break
                found.host.append(host_block)
                parent = self.host.entry(host_block).node
            found.nodes.append(parent)
            found.keys.append(key)
            parent_key = key
        return found

    def node_of(self, token_ids: list[int], salt: str | None) -> int | None:
        """The node of the last block of `token_ids` (whole blocks), None unless every
        block of it is cached."""
        found = self.match(token_ids, salt)
        whole = found.num_blocks * self.block_size == len(token_ids) and found.nodes
        return found.nodes[-1] if whole else None

    def insert(self, block: int, tokens: tuple[int, ...], salt: str | None,
               parent: tuple[int, int] | None) -> tuple[int, int]:
        """Index a full, computed block after the prefix `parent` ((key, node) of the block
        before it, None for a prompt's first block); return this prefix's (key, node). A
        prefix cached already in another block (a sequence that computed the same tokens at
        the same time) keeps that block, and the blocks after it chain on from it."""
        if block in self._blocks:
            return self._blocks[block].key, self._blocks[block].node
        parent_key, parent_node = parent or (0, NO_PARENT)
        key = self.block_key(parent_key, tokens, salt)
        same = self._confirmed(key, tokens, salt, parent_node)
        if same is not None:
            return key, self._blocks[same].node
        in_host = self.host.find(key, tokens, salt, parent_node) if self.host else None
        # The same prefix in the host tier keeps its node: offloading it again copies nothing.
        node = self.host.entry(in_host).node if in_host is not None else next(self._nodes)
        self.adopt(block, CachedBlock(key, tokens, salt, parent_node, node))
        return key, node

    def adopt(self, block: int, entry: CachedBlock) -> None:
        """Index a held device block under `entry` (a new one, or one copied back from host)."""
        self._blocks[block] = entry
        self._by_key.setdefault(entry.key, []).append(block)
        self.allocator.mark_cached(block)

    def _confirmed(self, key: int, tokens: tuple[int, ...], salt: str | None,
                   parent: int) -> int | None:
        return confirmed(self._by_key.get(key, ()), self._blocks, tokens, salt, parent)

    def _forget(self, block: int) -> None:
        info = self._blocks.pop(block, None)
        if info is None:
            return
        unindex(self._by_key, info.key, block)
        if self.host is not None:
            self.host.offload(block, info)

    def reset(self) -> None:
        """Forget every cached prefix, on the device and in the host tier. Only while no
        sequence holds a block: a held block's contents would stay indexed by nothing."""
        self._by_key.clear()
        self._blocks.clear()
        self.allocator.forget_cached()
        if self.host is not None:
            self.host.clear()

    def __contains__(self, block: int) -> bool:
        return block in self._blocks
