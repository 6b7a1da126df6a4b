"""Block allocator and block tables: free list, reference counts, copy-on-write, waste."""

from __future__ import annotations

import pytest

from tokenmill.engine.kv_cache import BlockAllocator, KVCacheManager, OutOfBlocks
from tokenmill.engine.sampling_params import SamplingParams


class _Seq:
    """The fields of a Sequence the cache manager reads."""

    _ids = iter(range(10**6))

    def __init__(self, computed: int = 0):
        self.seq_id = next(self._ids)
        self.block_table: list[int] = []
        self.num_computed_tokens = computed
        self.params = SamplingParams()


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
