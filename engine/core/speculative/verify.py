"""Verification: the step's logits give every draw its next token, and a draw with proposals
its following ones while they match what the target samples.

Each round samples one row per draw still going, exactly as plain decoding samples a step:
with the sequence's penalties, grammar, logprobs and generator as they stand after the tokens
appended so far. A proposal is accepted when the sampled token equals it; the first mismatch
is kept as the target's own token and ends the draw, as does a stop. Under greedy decoding the
output is therefore plain decoding's, token for token. Under sampling, with proposals that are
fixed tokens (q one-hot), accepting d with probability p(d) and otherwise drawing from p
without d (Leviathan et al.'s rejection rule for such q) is the same as drawing t from p and
accepting iff t == d: each emitted token keeps the target distribution, and a seeded sequence
draws its noise in the same order as without speculation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenmill.engine.core.request import Sequence
from tokenmill.engine.core.speculative.proposer import SpeculationStats

# Sample the given logit rows, one per sequence; append each token to its sequence (which
# may finish it); return the tokens.
SampleRows = Callable[[torch.Tensor, list[int], list[Sequence]], list[int]]


@dataclass(slots=True)
class Draw:
    """A sequence to sample this step: its first logit row and its proposals."""

    seq: Sequence
    row: int
    proposals: list[int] | tuple[()] = ()  # () where nothing is verified: no list per draw
    accepted: int = 0


def verify(draws: list[Draw], logits: torch.Tensor, sample_rows: SampleRows,
           stats: SpeculationStats | None = None) -> list[Draw]:
    """Sample every draw, accepting proposals while they match; each accepted proposal adds
    one computed token to its sequence (its KV was written this step). Returns the draws."""
    going = list(draws)
    offset = 0
    while going:
        tokens = sample_rows(logits, [d.row + offset for d in going], [d.seq for d in going])
        still = []
        for draw, token in zip(going, tokens, strict=True):
            if (offset < len(draw.proposals) and draw.seq.finish_reason is None
                    and token == draw.proposals[offset]):
                draw.accepted += 1
                draw.seq.num_computed_tokens += 1
                still.append(draw)
        going = still
        offset += 1
    for draw in draws:
        if draw.proposals:
            if stats is not None:
                stats.record(len(draw.proposals), draw.accepted)
            draw.seq.spec_tokens = []
    return draws
