"""Block allocator and block tables: free list, reference counts, copy-on-write, waste."""

from __future__ import annotations

import pytest

from tokenmill.engine.core.kv_cache import BlockAllocator, KVCacheManager, OutOfBlocks
from tokenmill.engine.core.sampling_params import SamplingParams


class _Seq:
    """The fields of a Sequence the cache manager reads."""

    _ids = iter(range(10**6))

    def __init__(self, computed: int = 0, tokens: list[int] | None = None,
                 salt: str | None = None):
        self.seq_id = next(self._ids)
        self.block_table: list[int] = []
        self.num_computed_tokens = computed
        self.num_cached_blocks = 0
        self.params = SamplingParams()
        self.token_ids = tokens or []
        self.cache_salt = salt
        self.prompt_logprobs = None  # asks for no prompt-token logprobs

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def test_allocator_free_list_and_ref_counts():
    alloc = BlockAllocator(3)
    a, b, c = alloc.allocate(), alloc.allocate(), alloc.allocate()
    assert {a, b, c} == {0, 1, 2} and alloc.num_free == 0
    with pytest.raises(OutOfBlocks):
        alloc.allocate()
    alloc.share(a)
    alloc.release(a)
    assert alloc.num_free == 0 and alloc.ref_count(a) == 1
    for block in (a, b, c):
        alloc.release(block)
    alloc.check_all_free()
    with pytest.raises(ValueError):
        alloc.release(a)
    with pytest.raises(ValueError):
        alloc.share(b)


def test_grow_allocates_whole_blocks_and_free_returns_them():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    seq = _Seq()
    assert kv.num_new_blocks(seq, 9) == 3
    assert kv.grow(seq, 9) == []
    assert len(seq.block_table) == 3 and kv.allocator.num_free == 5
    seq.num_computed_tokens = 9
    assert kv.num_new_blocks(seq, 3) == 0  # slots 9..11 fit the third block
    assert kv.slot(seq, 9) == seq.block_table[2] * 4 + 1
    kv.free(seq)
    assert seq.block_table == []
    kv.allocator.check_all_free()


def test_fork_shares_blocks_and_copy_on_write_splits_the_partial_one():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    parent = _Seq()
    kv.grow(parent, 6)  # two blocks, the second half full
    parent.num_computed_tokens = 6
    child = _Seq(computed=6)
    kv.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(kv.allocator.ref_count(b) == 2 for b in parent.block_table)
    shared_partial = parent.block_table[1]
    copies = kv.grow(child, 1)
    assert copies == [(shared_partial, child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    assert kv.allocator.ref_count(shared_partial) == 1
    assert kv.grow(parent, 1) == []  # now sole owner: writes in place
    kv.free(parent)
    kv.free(child)
    kv.allocator.check_all_free()


def test_stats_report_waste_as_unused_allocated_slots():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    seq = _Seq()
    kv.grow(seq, 5)
    seq.num_computed_tokens = 5
    stats = kv.stats()
    assert (stats.used_blocks, stats.allocated_slots, stats.used_slots) == (2, 8, 5)
    assert stats.waste == pytest.approx(3 / 8)
    assert stats.usage == pytest.approx(0.2)


def _prefilled(kv: KVCacheManager, tokens: list[int], salt: str | None = None) -> _Seq:
    """A sequence admitted with whatever the cache has, then fully computed and indexed."""
    seq = _Seq(tokens=tokens, salt=salt)
    cached = kv.match_prefix(seq)
    kv.admit(seq, cached)
    kv.grow(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_computed_blocks(seq)
    return seq


def test_prefix_cache_reuses_full_blocks_and_recomputes_the_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = _prefilled(kv, list(range(10)))  # blocks: [0-3] [4-7] [8,9]
    assert kv.allocator.num_cached == 2
    second = _Seq(tokens=list(range(8)) + [50, 51])
    cached = kv.match_prefix(second)
    assert cached == first.block_table[:2]
    exact = _Seq(tokens=list(range(8)))  # block-aligned: the last block is recomputed
    assert kv.match_prefix(exact) == first.block_table[:1]
    diverged = _Seq(tokens=[0, 1, 2, 99, 4, 5, 6, 7, 8])  # differs inside the first block
    assert kv.match_prefix(diverged) == []
    kv.admit(second, cached)
    assert second.num_computed_tokens == 8
    assert all(kv.allocator.ref_count(b) == 2 for b in cached)
    assert (kv.prefix_queries, kv.prefix_hits) == (20, 8)  # 10 + 10 looked up, 8 found


def test_cache_salt_separates_tenants():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    _prefilled(kv, list(range(9)), salt="tenant-a")
    assert len(kv.match_prefix(_Seq(tokens=list(range(9)), salt="tenant-a"))) == 2
    assert kv.match_prefix(_Seq(tokens=list(range(9)), salt="tenant-b")) == []
    assert kv.match_prefix(_Seq(tokens=list(range(9)))) == []


def test_released_cached_blocks_are_evicted_lru_and_never_while_in_use():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    old = _prefilled(kv, list(range(100, 109)))       # 3 blocks, 2 cached
    kv.free(old)
    assert kv.allocator.num_evictable == 2 and kv.allocator.num_free == 6
    recent = _prefilled(kv, list(range(200, 209)))
    recent_blocks = recent.block_table[:2]
    kv.free(recent)
    held = _prefilled(kv, list(range(200, 209)))       # revives recent's blocks
    assert held.block_table[:2] == recent_blocks
    big = _Seq(tokens=list(range(300, 312)))           # needs 3 blocks: evicts `old` first
    kv.admit(big, [])
    kv.grow(big, 12)
    assert kv.match_prefix(_Seq(tokens=list(range(100, 109)))) == []
    assert kv.match_prefix(_Seq(tokens=list(range(200, 209)))) == recent_blocks
    assert all(kv.allocator.ref_count(b) >= 1 for b in held.block_table)
    for seq in (held, big):
        kv.free(seq)
    kv.allocator.check_all_free()


def test_forged_hash_collisions_never_serve_other_tokens(monkeypatch):
    from tokenmill.engine.core.kv_cache.prefix_cache import PrefixCache

    monkeypatch.setattr(PrefixCache, "block_key", staticmethod(lambda *args: 7))
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = _prefilled(kv, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.match_prefix(_Seq(tokens=[1, 2, 3, 4, 9, 9, 9, 9, 9])) == a.block_table[:1]
    assert kv.match_prefix(_Seq(tokens=[5, 6, 7, 8, 1, 2, 3, 4, 0])) == []
    b = _prefilled(kv, [5, 6, 7, 8, 1, 2, 3, 4, 0])
    assert kv.match_prefix(_Seq(tokens=[5, 6, 7, 8, 1, 2, 3, 4, 1])) == b.block_table[:2]


def test_a_reallocated_parent_invalidates_its_cached_children(monkeypatch):
    from tokenmill.engine.core.kv_cache.prefix_cache import PrefixCache

    monkeypatch.setattr(PrefixCache, "block_key", staticmethod(lambda *args: 7))
    kv = KVCacheManager(num_blocks=3, block_size=2, enable_prefix_caching=True)
    first = _prefilled(kv, [1, 2, 3, 4, 5])   # blocks [1,2] [3,4] [5]
    parent, child = first.block_table[:2]
    kv.free(first)
    kv.allocator.share(child)
    kv.allocator.release(child)              # child is now the most recently used
    filler = _Seq(tokens=[0])
    kv.admit(filler, [])
    kv.grow(filler, 1)                        # takes the one free block
    other = _prefilled(kv, [7, 8])            # evicts the least recently used: the parent
    assert other.block_table == [parent] and kv.allocator.num_cached == 2
    # The parent block now holds [7, 8]. The cached child [3, 4] was computed after [1, 2]:
    # it must not be served after [7, 8] even though its tokens and parent id match.
    assert kv.match_prefix(_Seq(tokens=[7, 8, 3, 4, 0])) == [parent]
