"""Which decoding sequences speculate this step, and on how many tokens.

A sequence gets at most num_speculative_tokens proposals, never more than it may still emit
(its max_tokens and the model's context leave room for every proposal plus the token the
verification adds), and none while disable_by_batch_size or more sequences run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tokenmill.engine.contract.speculative import SpeculativeConfig
from tokenmill.engine.core.request import Sequence
from tokenmill.engine.core.speculative.ngram import propose_ngram


@dataclass
class SpeculationStats:
    """Running totals with vLLM's meanings: a draft is one sequence's proposals in one step."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_position) < proposed:
            self.accepted_per_position.append(0)
        for position in range(accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens each verified draft emits: its accepted proposals plus the token the target
        adds after them."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


def proposal_room(config: SpeculativeConfig, seq: Sequence, max_model_len: int,
                  num_running: int) -> int:
    """How many proposals seq may get this step (0: none)."""
    if config.disable_by_batch_size and num_running >= config.disable_by_batch_size:
        return 0
    return max(0, min(config.num_speculative_tokens,
                      seq.params.max_tokens - len(seq.output_token_ids) - 1,
                      max_model_len - seq.num_tokens - 1))


class Proposer(Protocol):
    """What the scheduler asks of a proposer, once per step for all decoding sequences (a
    draft model proposes for all of them in one batched pass per token)."""

    stats: SpeculationStats

    def propose_batch(self, seqs: list[Sequence], num_running: int) -> dict[int, list[int]]:
        """Each sequence's proposals for this step by seq_id (absent or []: none)."""

    def release(self, seq: Sequence) -> None:
        """seq left the running batch (finished, aborted, preempted): drop what is kept for
        it."""


MAX_PAUSE = 32  # tokens a sequence whose drafts keep failing goes without proposals, at most


@dataclass
class Backoff:
    """One sequence's record: where its pending draft was proposed, and how long it pauses
    after drafts of which nothing was accepted."""

    proposed_at: int | None = None  # seq.num_tokens when its latest draft was proposed
    misses: int = 0                 # drafts in a row with no token accepted
    resume_at: int = 0              # propose again once seq.num_tokens reaches this


class NgramProposer:
    """Prompt lookup, with a per-sequence back-off: a draft of which nothing is accepted
    pauses that sequence's proposals for 2, 4, 8, ... tokens (up to MAX_PAUSE), and any
    accepted token ends the pause. Text that does not repeat its context (free generation)
    then stops paying for verification rows that fail, while text that does keeps speculating.
    What was accepted is read off the sequence at its next proposal: it grew by the accepted
    proposals plus one."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len
        self.stats = SpeculationStats()
        self._backoff: dict[int, Backoff] = {}

    def propose(self, seq: Sequence, num_running: int) -> list[int]:
        """seq's proposals for this step ([]: it decodes one token as usual)."""
        config = self.config
        backoff = self._backoff.setdefault(seq.seq_id, Backoff())
        if backoff.proposed_at is not None and seq.num_tokens > backoff.proposed_at:
            if seq.num_tokens - backoff.proposed_at - 1 == 0:  # nothing accepted
                backoff.misses += 1
                backoff.resume_at = seq.num_tokens + min(2 ** backoff.misses, MAX_PAUSE)
            else:
                backoff.misses = 0
            backoff.proposed_at = None
        if seq.num_tokens < backoff.resume_at:
            return []
        room = proposal_room(config, seq, self.max_model_len, num_running)
        if room < 1:
            return []
        proposals = propose_ngram(seq.token_ids, room, config.prompt_lookup_max,
                                  config.prompt_lookup_min)
        if proposals:
            backoff.proposed_at = seq.num_tokens
        return proposals

    def propose_batch(self, seqs: list[Sequence], num_running: int) -> dict[int, list[int]]:
        return {seq.seq_id: self.propose(seq, num_running) for seq in seqs}

    def release(self, seq: Sequence) -> None:
        self._backoff.pop(seq.seq_id, None)
