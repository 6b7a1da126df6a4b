"""Which LoRA adapter each device slot holds, for the scheduler.

A running sequence pins its adapter's slot (a count of users), so the adapters of one step
never exceed the slots (--max-loras). An adapter not resident takes the least recently used
slot that no running sequence uses, and the step that first needs it carries a load order
(slot, directory) that every rank applies before its forward pass. An adapter's identity
includes its load generation, so one re-added under the same name is loaded afresh.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARef:
    """One registered adapter: its request name, local directory and load generation."""

    name: str
    directory: str
    generation: int

    @property
    def cache_salt(self) -> str:
        """Folded into the prefix cache's salt: KV computed under it is its own."""
        return f"lora:{self.name}#{self.generation}"


class LoRASlotTable:
    def __init__(self, num_slots: int):
        self.held: list[LoRARef | None] = [None] * num_slots
        self.users = [0] * num_slots
        self._last_used = [-1] * num_slots
        self._clock = itertools.count()
        self._loads: list[tuple[int, str]] = []

    def slot_of(self, ref: LoRARef) -> int | None:
        try:
            return self.held.index(ref)
        except ValueError:
            return None

    def has_free_slot(self) -> bool:
        return 0 in self.users

    def can_serve(self, ref: LoRARef | None) -> bool:
        """Whether a sequence of this adapter could join the batch now."""
        return ref is None or self.slot_of(ref) is not None or self.has_free_slot()

    def acquire(self, ref: LoRARef) -> int:
        """The slot a new user of `ref` reads; loads it there first if it is not resident.
        Call only after can_serve(ref) said yes."""
        slot = self.slot_of(ref)
        if slot is None:
            slot = min((i for i, n in enumerate(self.users) if n == 0),
                       key=lambda i: self._last_used[i])
            self.held[slot] = ref
            self._loads.append((slot, ref.directory))
        self.users[slot] += 1
        self._last_used[slot] = next(self._clock)
        return slot

    def release(self, slot: int) -> None:
        self.users[slot] -= 1
        self._last_used[slot] = next(self._clock)

    def forget(self, ref: LoRARef) -> None:
        """A removed adapter: its slot, once unused, is the first to be taken."""
        slot = self.slot_of(ref)
        if slot is not None and self.users[slot] == 0:
            self.held[slot] = None
            self._last_used[slot] = -1

    def take_loads(self) -> list[tuple[int, str]]:
        """The (slot, directory) loads ordered since the last call."""
        loads, self._loads = self._loads, []
        return loads
