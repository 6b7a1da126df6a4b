"""Continuous batching: decide, every step, which sequences run and how many tokens each feeds.

Each step has a token budget (max_num_batched_tokens). Running sequences go first, oldest
first: a decode costs one token, an unfinished prompt costs a chunk of what is left. Then
waiting sequences are admitted in arrival order while there is budget, a free batch seat and
KV blocks. When a running sequence needs a block and the pool is empty, the newest running
sequence is preempted by recompute: its blocks are freed and it goes back to the front of the
waiting queue, to be prefilled again (prompt plus what it generated) when there is room.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tokenmill.engine.kv_cache import KVCacheManager
from tokenmill.engine.request import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        chosen: set[int] = set()
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this step
            num_new = min(seq.num_uncomputed_tokens, budget)
            if self._make_room(seq, num_new, chosen, out):
                out.block_copies += self.kv.grow(seq, num_new)
                out.scheduled.append((seq, num_new))
                chosen.add(seq.seq_id)
                budget -= num_new
        if not out.preempted:
            self._admit(out, budget)
        return out

    def _make_room(self, seq: Sequence, num_new: int, chosen: set[int],
                   out: SchedulerOutput) -> bool:
        """Preempt the newest unscheduled running sequences until seq can grow."""
        while not self.kv.can_grow(seq, num_new):
            victims = [s for s in self.running if s.seq_id not in chosen]
            if not victims:
                return False
            victim = victims[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            seats = seq.params.n if not seq.output_token_ids and seq.index == 0 else 1
            if self.running and len(self.running) + seats > self.max_num_seqs:
                break
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self.kv.can_grow(seq, num_new):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = time.monotonic()
            out.block_copies += self.kv.grow(seq, num_new)
            out.scheduled.append((seq, num_new))
            self.running.append(seq)
            budget -= num_new

    def preempt(self, seq: Sequence) -> None:
        """Free seq's KV and requeue it first; it will be recomputed from its tokens."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence forked from a running one (n > 1) joins the batch directly."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove seq from whichever queue holds it and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
