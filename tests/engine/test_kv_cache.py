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
        self.cached_prefix = None
        self.params = SamplingParams()
        self.token_ids = tokens or []
        self.cache_salt = salt
        self.prompt_logprobs = None  # asks for no prompt-token logprobs

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def cache_token_ids(self) -> list[int]:  # no images
        return self.token_ids


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


def test_only_tokens_landing_in_blocks_held_alone_need_no_new_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    parent = _Seq()
    kv.grow(parent, 6)
    parent.num_computed_tokens = 6
    assert kv.num_new_blocks(parent, 1) == 0 and kv.num_new_blocks(parent, 2) == 0
    assert kv.num_new_blocks(parent, 3) != 0  # the ninth slot needs a third block
    child = _Seq(computed=6)
    kv.fork(parent, child)
    assert kv.num_new_blocks(child, 1) != 0 and kv.num_new_blocks(parent, 1) != 0  # shared
    kv.grow(child, 1)  # copy on write: each now holds its partial block alone
    assert kv.num_new_blocks(child, 1) == 0 and kv.num_new_blocks(parent, 1) == 0
    parent.num_computed_tokens = 8
    assert kv.num_new_blocks(parent, 1) != 0  # at a block boundary
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
    counters = kv.stats(slots=False)  # what a caller sampling every step can afford
    assert (counters.used_slots, counters.waste) == (None, None)
    assert (counters.used_blocks, counters.allocated_slots, counters.usage) == (2, 8, 0.2)


def _walked_used_slots(kv: KVCacheManager, seqs: list[_Seq]) -> int:
    """Used slots by definition: each block once, as full as its fullest holder has it."""
    owners: dict[int, int] = {}
    for seq in seqs:
        for i, block in enumerate(seq.block_table):
            filled = min(kv.block_size, max(0, seq.num_computed_tokens - i * kv.block_size))
            owners[block] = max(owners.get(block, 0), filled)
    return sum(owners.values())


def test_allocator_counts_the_blocks_held_more_than_once():
    alloc = BlockAllocator(4)
    a, b = alloc.allocate(), alloc.allocate()
    alloc.share(a)
    alloc.share(a)
    alloc.share(b)
    assert alloc.num_shared == 2
    alloc.release(a)
    assert alloc.num_shared == 2  # still held twice
    alloc.release(a)
    alloc.release(b)
    assert alloc.num_shared == 0


def test_used_slots_count_each_shared_block_once_and_unshared_tables_by_their_tokens():
    """Counting without sharing takes each table's computed tokens; with a cached prefix or
    a fork the blocks are walked. Both agree with the definition at every stage."""
    kv = KVCacheManager(num_blocks=40, block_size=4, enable_prefix_caching=True)
    live: list[_Seq] = []

    def check() -> None:
        assert kv.stats().used_slots == _walked_used_slots(kv, live)

    for computed, tokens in ((5, 7), (8, 8), (0, 3), (13, 13)):  # partial, full, none, mixed
        seq = _Seq()
        kv.grow(seq, tokens)
        seq.num_computed_tokens = computed
        live.append(seq)
        check()
    assert kv.allocator.num_shared == 0
    prompt = list(range(100, 110))
    live.append(_prefilled(kv, prompt))
    live.append(_prefilled(kv, prompt + [7, 8, 9]))  # its first two blocks are the cache's
    assert kv.allocator.num_shared == 2
    check()
    child = _Seq(computed=live[0].num_computed_tokens)
    kv.fork(live[0], child)
    live.append(child)
    check()
    for seq in live[-3:]:
        kv.free(seq)
    del live[-3:]
    assert kv.allocator.num_shared == 0
    check()


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
    assert cached.device == first.block_table[:2]
    exact = _Seq(tokens=list(range(8)))  # block-aligned: the last block is recomputed
    assert kv.match_prefix(exact).device == first.block_table[:1]
    diverged = _Seq(tokens=[0, 1, 2, 99, 4, 5, 6, 7, 8])  # differs inside the first block
    assert kv.match_prefix(diverged).device == []
    kv.admit(second, cached)
    assert second.num_computed_tokens == 8
    assert all(kv.allocator.ref_count(b) == 2 for b in cached.device)
    assert (kv.prefix_queries, kv.prefix_hits) == (20, 8)  # 10 + 10 looked up, 8 found


def test_cache_salt_separates_tenants():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    _prefilled(kv, list(range(9)), salt="tenant-a")
    assert kv.match_prefix(_Seq(tokens=list(range(9)), salt="tenant-a")).num_blocks == 2
    assert kv.match_prefix(_Seq(tokens=list(range(9)), salt="tenant-b")).device == []
    assert kv.match_prefix(_Seq(tokens=list(range(9)))).device == []


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
    assert kv.match_prefix(_Seq(tokens=list(range(100, 109)))).device == []
    assert kv.match_prefix(_Seq(tokens=list(range(200, 209)))).device == recent_blocks
    assert all(kv.allocator.ref_count(b) >= 1 for b in held.block_table)
    for seq in (held, big):
        kv.free(seq)
    kv.allocator.check_all_free()


def test_forged_hash_collisions_never_serve_other_tokens(monkeypatch):
    from tokenmill.engine.core.kv_cache.prefix_cache import PrefixCache

    monkeypatch.setattr(PrefixCache, "block_key", staticmethod(lambda *args: 7))
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = _prefilled(kv, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.match_prefix(_Seq(tokens=[1, 2, 3, 4, 9, 9, 9, 9, 9])).device == a.block_table[:1]
    assert kv.match_prefix(_Seq(tokens=[5, 6, 7, 8, 1, 2, 3, 4, 0])).device == []
    b = _prefilled(kv, [5, 6, 7, 8, 1, 2, 3, 4, 0])
    assert kv.match_prefix(_Seq(tokens=[5, 6, 7, 8, 1, 2, 3, 4, 1])).device == b.block_table[:2]


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
    assert kv.match_prefix(_Seq(tokens=[7, 8, 3, 4, 0])).device == [parent]


# ---- the host tier ----------------------------------------------------------------------------

def _evict_all(kv: KVCacheManager) -> _Seq:
    """Fill the device pool with an uncached sequence, evicting every cached block."""
    filler = _Seq(tokens=[0])
    kv.admit(filler, [])
    kv.grow(filler, kv.allocator.num_free * kv.block_size)
    return filler


def test_evicted_blocks_go_to_the_host_tier_and_a_match_continues_there():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=True,
                        num_host_blocks=8)
    first = _prefilled(kv, list(range(13)))            # 4 blocks, the first 3 cached
    device_blocks = first.block_table[:3]
    assert kv.take_transfers() == ([], [])
    kv.free(first)
    filler = _evict_all(kv)
    to_host, to_device = kv.take_transfers()
    assert sorted(d for d, _ in to_host) == sorted(device_blocks) and to_device == []
    assert kv.host.num_used == 3 and kv.allocator.num_cached == 0
    kv.free(filler)

    again = _Seq(tokens=list(range(13)) + [99])
    match = kv.match_prefix(again)
    assert match.device == [] and len(match.host) == 3
    assert kv.can_admit(again, match, 2)
    kv.admit(again, match)
    assert again.num_computed_tokens == 12 and again.num_cached_blocks == 3
    _, to_device = kv.take_transfers()
    host_of = {d: h for d, h in to_host}
    # Each host block goes back into a fresh device block, in the prefix's order.
    assert [h for _, h in to_device] == [host_of[b] for b in device_blocks]
    assert [d for d, _ in to_device] == again.block_table
    assert (kv.prefix_hits, kv.host_prefix_hits) == (12, 12)
    # The copied-back blocks are device-cached again: the next match stays on the device.
    assert kv.match_prefix(_Seq(tokens=list(range(13)))).device == again.block_table
    kv.free(again)
    kv.allocator.check_all_free()
    kv.host.check_consistent()


def test_a_prefix_split_across_tiers_matches_device_then_host():
    kv = KVCacheManager(num_blocks=5, block_size=2, enable_prefix_caching=True,
                        num_host_blocks=4)
    seq = _prefilled(kv, [1, 2, 3, 4, 5, 6, 7])        # cached [1,2] [3,4] [5,6]
    blocks = list(seq.block_table)
    kv.free(seq)                                       # released tail first: LRU is [5,6]
    user = _Seq(tokens=[9])
    kv.admit(user, [])
    kv.grow(user, 6)                                   # 3 blocks: 2 free + evicts [5,6]
    to_host, _ = kv.take_transfers()
    assert len(to_host) == 1 and kv.host.num_used == 1
    match = kv.match_prefix(_Seq(tokens=[1, 2, 3, 4, 5, 6, 0]))
    assert match.device == blocks[:2] and match.host == [to_host[0][1]]
    # A different history after the same first blocks does not match the host block.
    assert kv.match_prefix(_Seq(tokens=[1, 2, 8, 8, 5, 6, 0])).num_blocks == 1
    kv.free(user)
    kv.host.check_consistent()


def test_the_host_tier_evicts_lru_never_a_block_pinned_this_step_and_copies_once():
    kv = KVCacheManager(num_blocks=2, block_size=2, enable_prefix_caching=True,
                        num_host_blocks=2)
    a = _prefilled(kv, [1, 2, 0])                      # one cached block each
    kv.free(a)
    b = _prefilled(kv, [3, 4, 0])                      # evicts a's block -> host
    kv.free(b)
    c = _prefilled(kv, [5, 6, 0])                      # evicts b's block -> host
    kv.free(c)
    assert len(kv.take_transfers()[0]) == 2 and kv.host.num_used == 2
    # Bring a back (pinned while the step is built); c is evicted into the one unpinned block.
    back = _Seq(tokens=[1, 2, 7])
    match = kv.match_prefix(back)
    assert len(match.host) == 1
    kv.admit(back, match)
    kv.grow(back, 1)
    to_host, to_device = kv.take_transfers()
    assert match.host[0] not in [h for _, h in to_host]
    assert [h for _, h in to_device] == match.host
    assert kv.match_prefix(_Seq(tokens=[3, 4, 0])).num_blocks == 0   # b was the LRU: gone
    assert kv.match_prefix(_Seq(tokens=[5, 6, 0])).num_blocks == 1   # c: in the host tier
    # a's block goes back to the device and out again: the host still holds it, no new copy.
    kv.free(back)
    _evict_all(kv)
    to_host, _ = kv.take_transfers()
    assert to_host == []
    assert kv.host.blocks_offloaded == 3 and kv.host.blocks_loaded == 1
    kv.host.check_consistent()


def test_without_prefix_caching_there_is_no_host_tier():
    kv = KVCacheManager(num_blocks=4, block_size=4, num_host_blocks=8)
    assert kv.host is None and kv.take_transfers() == ([], [])
    assert kv.stats().host_blocks == 0


def test_recurrent_state_slots_follow_sequences_and_forks():
    """A linear-attention model's sequences each hold a state slot from admission to their
    end; a fork takes its own, with a copy of its parent's queued; admission waits for a free
    slot as it waits for blocks."""
    kv = KVCacheManager(num_blocks=16, block_size=4, state_slots=2)
    first, second, child = _Seq(tokens=[1, 2, 3]), _Seq(tokens=[4, 5]), _Seq()
    for seq in (first, second, child):
        seq.state_slot = -1
    assert kv.can_admit(first, kv.match_prefix(first), 3)
    kv.admit(first, [])
    assert first.state_slot == 0 and kv.states.num_free == 1
    kv.fork(first, child)
    assert child.state_slot == 1
    assert kv.take_state_copies() == [(0, 1)] and kv.take_state_copies() == []
    assert not kv.can_admit(second, kv.match_prefix(second), 2)  # no slot left
    kv.free(first)
    assert first.state_slot == -1 and kv.can_admit(second, kv.match_prefix(second), 2)
    kv.admit(second, [])
    assert second.state_slot == 0
    kv.free(second)
    kv.free(child)
    assert kv.states.num_free == 2
