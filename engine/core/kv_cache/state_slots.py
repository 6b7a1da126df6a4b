"""Which recurrent-state slot each sequence holds, for a model with linear-attention layers
(execution/recurrent_states.py holds the tensors): one slot per sequence from admission to
its end, whatever its length. A fork (n > 1) takes a slot of its own, into which the
parent's state is copied before the next step runs."""

from __future__ import annotations


class StateSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # the lowest handed out first
        self._copies: list[tuple[int, int]] = []

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.num_slots} recurrent-state slots are held; the "
                               "scheduler admits at most max_num_seqs sequences")
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def fork(self, parent: int) -> int:
        """A slot for a fork of the sequence holding `parent`, its state copied there."""
        child = self.acquire()
        self._copies.append((parent, child))
        return child

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) copies queued since the last call; they must run
        before the next step (and before it zeroes any slot)."""
        copies, self._copies = self._copies, []
        return copies
