"""Recurrent states the prefix cache keeps, for a model with linear-attention or Mamba-2
layers: a cached prefix is of use to such a model only where the state after it is kept too,
since its layers cannot rebuild the state from keys and values.

A checkpoint is a state slot of its own (beside the sequences' slots in
execution/recurrent_states.py) holding every such layer's state after a prefix that ends on a
block boundary, indexed by the prefix cache's node of the block ending there (a node is one
exact prefix, confirmed token for token: prefix_cache.py). The scheduler cuts a prompt's
chunk at two points so that their states exist: where the prefix found cached for it ends (the
junction: the next request sharing that prefix then resumes there) and at the prompt's last
block boundary (a conversation's next turn resumes there). Checkpoints are evicted least
recently used first.

The copy into a checkpoint runs before the step after the one that computed its prefix (its
sequence's slot holds that state until then); the checkpoint is found only once that copy
has been handed out, so a restore never reads a checkpoint in the same batch of copies that
writes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tokenmill.engine.core.request import Sequence

# The prefix cache's node of a prefix's last block (None where the prefix is not all cached).
NodeOf = Callable[[list[int], str | None], int | None]


@dataclass
class _Save:
    seq: Sequence
    position: int
    source: int  # the sequence's slot, holding the state after `position` tokens
    slot: int
    node: int | None  # the prefix's, where it was cached when the save was asked for


class StateCheckpoints:
    def __init__(self, first_slot: int, num_slots: int, block_size: int, node_of: NodeOf):
        """Slots first_slot .. first_slot + num_slots - 1 of the state pool hold
        checkpoints."""
        self.num_slots = num_slots
        self.block_size = block_size
        self.node_of = node_of
        self._free = list(range(first_slot + num_slots - 1, first_slot - 1, -1))
        self._by_node: OrderedDict[int, int] = OrderedDict()  # least recently used first
        self._restores: list[tuple[int, int]] = []
        self._requested: list[_Save] = []  # this step's: copied before the next one
        self._due: list[_Save] = []        # the last step's: copied before this one

    @property
    def num_kept(self) -> int:
        return len(self._by_node)

    def find(self, nodes: list[int]) -> tuple[int, int] | None:
        """(blocks, slot) of the longest prefix with a checkpoint among a prompt's cached
        blocks, given their nodes in order; None without one."""
        for count in range(len(nodes), 0, -1):
            slot = self._by_node.get(nodes[count - 1])
            if slot is not None:
                self._by_node.move_to_end(nodes[count - 1])
                return count, slot
        return None

    def restore(self, slot: int, into: int) -> None:
        """Copy checkpoint `slot` into a sequence's slot before its first step."""
        self._restores.append((slot, into))

    def save(self, seq: Sequence, position: int, node: int | None = None) -> None:
        """Keep seq's state after `position` tokens (this step computes up to there), in a
        free slot or the least recently used checkpoint's. `node`: the prefix's, where it is
        cached already: a prefix kept, or about to be, is not kept twice."""
        if node is not None and (node in self._by_node or any(
                save.node == node for save in self._requested + self._due)):
            return
        if self._free:
            slot = self._free.pop()
        elif self._by_node:
            slot = self._by_node.popitem(last=False)[1]
        else:
            return  # every slot awaits its copy
        self._requested.append(_Save(seq, position, seq.state_slot, slot, node))

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) slot copies to run before the step being handed out:
        restores of sequences it starts, and the saves of states the last step computed, which
        are indexed from now on."""
        copies = self._restores + [(save.source, save.slot) for save in self._due]
        for save in self._due:
            self._index(save)
        self._restores, self._due, self._requested = [], self._requested, []
        return copies

    def _index(self, save: _Save) -> None:
        tokens = save.seq.cache_token_ids()[:save.position]
        node = self.node_of(tokens, save.seq.cache_salt)
        if node is None or node in self._by_node:  # not cached, or kept already
            self._free.append(save.slot)
            return
        self._by_node[node] = save.slot

    def clear(self) -> None:
        """Forget every checkpoint (the prefix cache forgot its prefixes)."""
        self._free += list(self._by_node.values()) + [save.slot for save in self._due]
        self._by_node.clear()
        self._due = []
