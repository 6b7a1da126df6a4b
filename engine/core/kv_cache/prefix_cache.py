"""Prefix cache: full KV blocks indexed by the exact token prefix that produced them.

Chained block hashes (as in vLLM) rather than a radix tree (as in SGLang): a block's key is
hash(parent's key, its tokens, cache salt), so a lookup is one dictionary probe per block and
the cache is a flat map beside the allocator, with no tree to keep balanced on eviction. The
hash only finds candidates. A candidate is used only if its stored tokens and salt equal ours
and its parent is exactly the block we matched just before, in the same generation (not
reallocated since), so by induction the whole prefix is confirmed token for token and a hash
collision can never serve another prompt's KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.engine.core.kv_cache.block_allocator import BlockAllocator

NO_PARENT = -1


@dataclass(frozen=True)
class CachedBlock:
    key: int
    tokens: tuple[int, ...]
    salt: str | None
    parent: int
    parent_generation: int


class PrefixCache:
    def __init__(self, allocator: BlockAllocator, block_size: int):
        self.allocator = allocator
        self.block_size = block_size
        self._by_key: dict[int, list[int]] = {}
        self._blocks: dict[int, CachedBlock] = {}
        allocator.on_evict = self._forget

    @staticmethod
    def block_key(parent_key: int, tokens: tuple[int, ...], salt: str | None) -> int:
        """Candidate key of a block; collisions are harmless (see the module docstring)."""
        return hash((parent_key, tokens, salt))

    def match(self, token_ids: list[int], salt: str | None) -> list[int]:
        """Cached blocks holding the longest prefix of token_ids, in order."""
        matched: list[int] = []
        parent, parent_key = NO_PARENT, 0
        bs = self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            tokens = tuple(token_ids[start:start + bs])
            key = self.block_key(parent_key, tokens, salt)
            block = self._confirmed(key, tokens, salt, parent)
            if block is None:
                break
            matched.append(block)
            parent, parent_key = block, key
        return matched

    def insert(self, block: int, tokens: tuple[int, ...], salt: str | None, parent: int) -> None:
        """Index a full, computed block whose predecessor in its sequence is `parent`."""
        if block in self._blocks:
            return
        if parent != NO_PARENT and parent not in self._blocks:
            return  # the chain above is not cached, so this block could never be reached
        parent_key = self._blocks[parent].key if parent != NO_PARENT else 0
        key = self.block_key(parent_key, tokens, salt)
        if self._confirmed(key, tokens, salt, parent) is not None:
            return  # the same prefix is already cached in another block
        parent_generation = self.allocator.generation[parent] if parent != NO_PARENT else 0
        self._blocks[block] = CachedBlock(key, tokens, salt, parent, parent_generation)
        self._by_key.setdefault(key, []).append(block)
        self.allocator.mark_cached(block)

    def _confirmed(self, key: int, tokens: tuple[int, ...], salt: str | None,
                   parent: int) -> int | None:
        for block in self._by_key.get(key, ()):
            info = self._blocks[block]
            if info.tokens != tokens or info.salt != salt or info.parent != parent:
                continue
            if parent != NO_PARENT and self.allocator.generation[parent] != info.parent_generation:
                continue
            return block
        return None

    def _forget(self, block: int) -> None:
        info = self._blocks.pop(block, None)
        if info is None:
            return
        same_key = self._by_key[info.key]
        same_key.remove(block)
        if not same_key:
            del self._by_key[info.key]

    def __contains__(self, block: int) -> bool:
        return block in self._blocks
