"""Continuous batching: decide, every step, which sequences run and how many tokens each feeds.

Each step has a token budget (max_num_batched_tokens). Running decodes go first (one token
each), so streams already producing tokens never stall; running prompts that are still being
prefilled take chunks of what budget is left (at most --long-prefill-token-threshold each,
when set, so several prompts advance together); then waiting sequences are admitted while there
is budget, a free batch seat and KV blocks (without chunked prefill, a prompt is never split:
it waits until the rest of it fits in one step's budget). A waiting sequence starts from the
longest prefix of its tokens found in the prefix cache and only prefills the rest; the part of
that prefix found in the host tier takes device blocks, into which it is copied before the step
runs (copies cost no token budget: no token goes through the model). When several wait, the
one with the longest cached prefix goes first (cheapest to start, and its blocks are not
evicted meanwhile), unless the oldest has already been passed over MAX_BYPASSES times.

When a running sequence needs a block and the pool is empty, the newest running sequence not
yet scheduled in this step is preempted: its blocks are freed and it goes back to the front of
the waiting queue. With the prefix cache, its full blocks stay cached when freed, so this is a
swap without an eager copy: at readmission its prefix match finds them on the device if no one
took them, or in the host tier, which received each one as the device evicted it. Only what
neither holds (at least its last, partial block; all of it without the cache) is computed again
from its tokens (prompt plus what it generated). Offloading lazily, at eviction, copies no
block that the pool does not reuse, and never more than an eager swap would.

Under --scheduling-policy priority, each request carries a priority (lower runs first, ties
by arrival), as in vLLM. The waiting queue is kept in that order, so admission (and the
cache-aware choice, made only among the sequences of the first one's priority) follows it;
running sequences take the step's budget in that order; the sequence preempted for blocks is
the lowest-priority one; and a waiting sequence that finds no seat or blocks preempts running
sequences of strictly lower priority until it fits (strictly: equals never preempt each other,
so nothing thrashes). Under fcfs (the default) every priority is 0 and the order is arrival.

With LoRA adapters (`lora`, a LoRASlotTable of --max-loras device slots), a running sequence
holds its adapter's slot, so no step runs more adapters than there are slots. A waiting
sequence whose adapter is not resident and finds no free slot waits while others go ahead:
the base model's and those of resident adapters; later sequences of other non-resident
adapters wait behind it, so the first slot that frees is its.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tokenmill.engine.contract.config import SCHEDULING_POLICIES
from tokenmill.engine.core.images import whole_images
from tokenmill.engine.core.kv_cache import KVCacheManager, PrefixMatch
from tokenmill.engine.core.lora_slots import LoRASlotTable
from tokenmill.engine.core.request import Sequence, SequenceStatus
from tokenmill.engine.core.speculative.proposer import Proposer

MAX_BYPASSES = 8        # admissions that may overtake the oldest waiting sequence
MAX_CANDIDATES = 64     # waiting sequences considered for cache-aware admission


def priority_key(seq: Sequence) -> tuple[int, float, int]:
    """The order of --scheduling-policy priority: lower priority value first, then arrival."""
    return seq.priority, seq.timings.arrival, seq.seq_id


def _seats(seq: Sequence) -> int:
    """The batch seats a waiting sequence takes: n for a request not yet sampled (it forks at
    its first token), else 1."""
    return seq.params.n if not seq.output_token_ids and seq.index == 0 else 1


@dataclass
class ResumedTokens:
    """What preempted sequences had computed, at their readmission: found cached on the device,
    copied back from the host tier, or computed again. (Prompt tokens a sequence had not
    reached when it was preempted are not counted: they cost the same either way.)"""

    readmissions: int = 0
    device: int = 0
    host: int = 0
    recomputed: int = 0


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # (device block, host block) copies of the host tier, run before the step's forward pass.
    kv_to_host: list[tuple[int, int]] = field(default_factory=list)
    kv_to_device: list[tuple[int, int]] = field(default_factory=list)
    lora_loads: list[tuple[int, str]] = field(default_factory=list)  # (slot, adapter directory)
    # Recurrent-state copies (source slot, fork's slot) of forks since the last step.
    state_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 proposer: Proposer | None = None, lora: LoRASlotTable | None = None,
                 chunked_prefill: bool = True, policy: str = "fcfs",
                 long_prefill_token_threshold: int = 0):
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy {policy!r} is not one of {SCHEDULING_POLICIES}")
        self.by_priority = policy == "priority"
        self.kv = kv
        self.chunked_prefill = chunked_prefill  # False: a prompt waits until it fits whole
        # The most prompt tokens a sequence computes in one step (0: what the budget leaves).
        self.prefill_cap = long_prefill_token_threshold or max_num_batched_tokens
        self.lora = lora
        self.proposer = proposer  # speculative decoding's, None without
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.resumed_tokens = ResumedTokens()

    def add(self, seq: Sequence) -> None:
        if self.by_priority:
            self._enqueue_by_priority(seq)
        else:
            self.waiting.append(seq)

    def _enqueue_by_priority(self, seq: Sequence) -> None:
        """Insert seq after every waiting sequence that goes before it."""
        key = priority_key(seq)
        position = len(self.waiting)
        while position and priority_key(self.waiting[position - 1]) > key:
            position -= 1
        self.waiting.insert(position, seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        chosen: set[int] = set()
        if self.by_priority:
            self.running.sort(key=priority_key)
            self._preempt_for_waiting(out)
        preempted_for_waiting = len(out.preempted)
        decodes, prefills = [], []
        for s in self.running:
            left = s.num_uncomputed_tokens
            if left > 1:
                prefills.append(s)
            elif left == 1 and not s.awaits_last_token:
                decodes.append(s)
        proposals = (self.proposer.propose_batch(decodes, len(self.running))
                     if self.proposer is not None and decodes else {})
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this step
            left = seq.num_uncomputed_tokens
            if not self.chunked_prefill and left > budget:
                continue
            num_new = self._chunk(seq, seq.num_computed_tokens,
                                  min(left, budget, self.prefill_cap))
            if num_new == 0:
                continue
            if num_new == 1 and self.proposer is not None:
                num_new += self._speculate(seq, proposals.get(seq.seq_id, []), budget - 1)
            if self.kv.num_new_blocks(seq, num_new):  # 0: it writes in blocks it holds alone
                if not self._make_room(seq, num_new, chosen, out):
                    continue
                out.block_copies += self.kv.grow(seq, num_new)
            self.kv.keep_state(seq, seq.num_computed_tokens, num_new)
            out.scheduled.append((seq, num_new))
            chosen.add(seq.seq_id)
            budget -= num_new
        if len(out.preempted) == preempted_for_waiting:  # no running sequence short of blocks
            self._admit(out, budget)
        out.kv_to_host, out.kv_to_device = self.kv.take_transfers()
        if out.scheduled:  # else no step runs: the copies wait for one
            out.state_copies = self.kv.take_state_copies()
        if self.lora is not None:
            out.lora_loads = self.lora.take_loads()
        return out

    def _chunk(self, seq: Sequence, start: int, num_new: int) -> int:
        """How many of `num_new` tokens from `start` seq computes this step: a chunk of a
        model with recurrent states is cut where its state is to be kept
        (KVCacheManager.checkpoint_cut; never without chunked prefill), and no chunk cuts an
        image seen both ways (whole_images; where the cut would, the chunk is not cut)."""
        cut = self.kv.checkpoint_cut(seq, start) if self.chunked_prefill else None
        chunk = num_new if cut is None or cut >= start + num_new else cut - start
        if not seq.images:
            return chunk
        return whole_images(seq.images, start, chunk) or whole_images(seq.images, start,
                                                                      num_new)

    def _speculate(self, seq: Sequence, proposals: list[int], budget: int) -> int:
        """Give a decoding seq its proposals for this step, as many as the budget and the free
        blocks allow (speculation never preempts); return how many."""
        proposals = proposals[:budget]
        if proposals and not self.kv.can_grow(seq, 1 + len(proposals)):
            proposals = []
        seq.spec_tokens = proposals
        return len(proposals)

    def _make_room(self, seq: Sequence, num_new: int, chosen: set[int],
                   out: SchedulerOutput) -> bool:
        """Preempt the last unscheduled running sequences until seq can grow: the newest, or
        under the priority policy (which keeps `running` in its order) the lowest-priority."""
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
            candidates = self._admissible()
            if not candidates:
                break
            seq, cached = self._next_waiting(candidates)
            if self.running and len(self.running) + _seats(seq) > self.max_num_seqs:
                break
            start = cached.num_blocks * self.kv.block_size
            seq.state_junction = cached.junction * self.kv.block_size
            num_new = self._chunk(seq, start,
                                  min(seq.num_tokens - start, budget, self.prefill_cap))
            if num_new == 0 or (not self.chunked_prefill and num_new < seq.num_tokens - start):
                break  # the rest of the prompt (or an image) does not fit this step's budget
            if not self.kv.can_admit(seq, cached, num_new):
                break
            for other in self.waiting:
                if other is seq:
                    break
                other.times_bypassed += 1
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = time.monotonic()
            self.kv.admit(seq, cached)
            self._acquire_lora(seq)
            if seq.num_preemptions:
                self._account_resumed(seq, cached)
            else:
                seq.num_cached_prompt_tokens = min(start, len(seq.prompt_token_ids))
            out.block_copies += self.kv.grow(seq, num_new)
            self.kv.keep_state(seq, start, num_new)
            out.scheduled.append((seq, num_new))
            self.running.append(seq)
            budget -= num_new

    def _account_resumed(self, seq: Sequence, cached: PrefixMatch) -> None:
        resumed = self.resumed_tokens
        resumed.readmissions += 1
        resumed.device += len(cached.device) * self.kv.block_size
        resumed.host += len(cached.host) * self.kv.block_size
        resumed.recomputed += max(0, seq.num_computed_when_preempted
                                  - cached.num_blocks * self.kv.block_size)

    def _admissible(self) -> list[Sequence]:
        """The waiting sequences that could join now, oldest first: all of them without LoRA;
        with it, those whose adapter is resident or can take a free slot, until one cannot
        (after it, only the base model's and resident adapters' go ahead)."""
        if self.lora is None:
            return list(self.waiting)
        ready, blocked = [], False
        for seq in self.waiting:
            resident = seq.lora is None or self.lora.slot_of(seq.lora) is not None
            if resident or (not blocked and self.lora.has_free_slot()):
                ready.append(seq)
            else:
                blocked = True
        return ready

    def _next_waiting(self, candidates: list[Sequence]) -> tuple[Sequence, PrefixMatch]:
        """The candidate to admit next and its cached prefix blocks."""
        oldest = candidates[0]
        first = (oldest, self.kv.match_prefix(oldest))
        if (self.kv.prefix_cache is None or len(candidates) == 1 or oldest.num_preemptions
                or oldest.times_bypassed >= MAX_BYPASSES):
            return first
        best = first
        for i, seq in enumerate(candidates):
            if i == 0:
                continue
            if i >= MAX_CANDIDATES or seq.priority != oldest.priority:
                break
            cached = self.kv.match_prefix(seq)
            if cached.num_blocks > best[1].num_blocks:
                best = (seq, cached)
        return best

    def preempt(self, seq: Sequence) -> None:
        """Free seq's KV and requeue it first; at readmission it resumes from what the prefix
        cache still holds of it and recomputes the rest from its tokens."""
        self.running.remove(seq)
        self.kv.free(seq)
        self._release(seq)
        seq.spec_tokens = []
        seq.num_computed_when_preempted = seq.num_computed_tokens
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if self.by_priority:
            self._enqueue_by_priority(seq)
        else:
            self.waiting.appendleft(seq)

    def _preempt_for_waiting(self, out: SchedulerOutput) -> None:
        """Priority policy: while the first waiting sequence finds no seat or no blocks for
        its first step, preempt the lowest-priority running sequence, if that is of strictly
        lower priority than it. `running` is in priority order: the last is the lowest."""
        while self.waiting and self.running:
            head, victim = self.waiting[0], self.running[-1]
            if victim.priority <= head.priority or self._fits(head):
                return
            self.preempt(victim)
            out.preempted.append(victim)

    def _fits(self, seq: Sequence) -> bool:
        """Whether waiting seq has a seat and the blocks for a full step's chunk of it."""
        if len(self.running) + _seats(seq) > self.max_num_seqs:
            return False
        cached = self.kv.match_prefix(seq)
        start = cached.num_blocks * self.kv.block_size
        return self.kv.can_admit(seq, cached, min(seq.num_tokens - start, self.prefill_cap))

    def add_running(self, seq: Sequence) -> None:
        """A sequence forked from a running one (n > 1) joins the batch directly."""
        seq.status = SequenceStatus.RUNNING
        self._acquire_lora(seq)
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove seq from whichever queue holds it and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        self._release(seq)
        seq.status = SequenceStatus.FINISHED

    def _acquire_lora(self, seq: Sequence) -> None:
        if seq.lora is not None:
            seq.lora_slot = self.lora.acquire(seq.lora)

    def _release(self, seq: Sequence) -> None:
        if self.proposer is not None:
            self.proposer.release(seq)
        if seq.lora_slot >= 0:
            self.lora.release(seq.lora_slot)
            seq.lora_slot = -1

