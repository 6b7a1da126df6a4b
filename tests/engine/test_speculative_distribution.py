"""Verification keeps the target's distribution under sampling: over many draws on a small
vocabulary, the first emitted token follows the first row's softmax, and the token after an
accepted proposal follows the next row's (chi-square against the expected counts)."""

from __future__ import annotations

import torch

from tokenmill.engine.core.request import RequestTimings, Sequence
from tokenmill.engine.core.sampler import sample
from tokenmill.engine.core.sampling_params import SamplingParams
from tokenmill.engine.core.speculative.proposer import SpeculationStats
from tokenmill.engine.core.speculative.verify import Draw, verify

DRAWS = 20_000
# Chi-square critical values at p = 0.001 by degrees of freedom: a correct sampler fails one
# seed in a thousand; the seed is fixed, so the test is deterministic.
CRITICAL = {5: 20.52}
PROPOSALS = [2, 4]


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


def test_emitted_tokens_follow_the_target_rows():
    rows = torch.tensor([[1.0, 0.2, 0.9, -0.5, 0.3, 0.0],
                         [0.1, 0.4, -0.2, 0.8, 1.1, 0.5],
                         [0.0, 0.0, 0.5, 0.5, 1.0, -1.0]])
    logits = rows.repeat(DRAWS, 1)  # draw i reads rows 3i..3i+2
    params = SamplingParams(temperature=1.0, max_tokens=10)
    seqs = [Sequence(i, "r", 0, [0], params, None, None, RequestTimings())
            for i in range(DRAWS)]
    draws = [Draw(seq, 3 * i, list(PROPOSALS)) for i, seq in enumerate(seqs)]
    generator = torch.Generator().manual_seed(1234)

    def sample_rows(logits: torch.Tensor, index: list[int], seqs: list[Sequence]) -> list[int]:
        tokens = sample(logits[torch.tensor(index)], seqs, generator).token_ids
        for seq, token in zip(seqs, tokens, strict=True):
            seq.output_token_ids.append(token)
        return tokens

    stats = SpeculationStats()
    verify(draws, logits, sample_rows, stats)
    probs = torch.softmax(rows, dim=-1)
    first = torch.tensor([s.output_token_ids[0] for s in seqs])
    assert _chi_square(first, probs[0]) < CRITICAL[5]
    accepted = [s for s in seqs if s.output_token_ids[0] == PROPOSALS[0]]
    second = torch.tensor([s.output_token_ids[1] for s in accepted])
    assert _chi_square(second, probs[1]) < CRITICAL[5]
    # A draw goes on exactly while its tokens match the proposals; the last token is always
    # the target's own.
    for seq, draw in zip(seqs, draws, strict=True):
        out = seq.output_token_ids
        assert out[:draw.accepted] == PROPOSALS[:draw.accepted]
        assert len(out) == draw.accepted + 1
        assert draw.accepted == len(PROPOSALS) or out[-1] != PROPOSALS[draw.accepted]
    # Acceptance matches the target's probability of each proposal.
    rate = stats.accepted_per_position[0] / DRAWS
    assert abs(rate - float(probs[0, PROPOSALS[0]])) < 0.015
    assert stats.num_drafts == DRAWS and stats.num_draft_tokens == 2 * DRAWS


def test_a_sampler_that_ignored_the_rows_would_fail_the_check():
    """The check has power: tokens drawn from the wrong row are rejected."""
    rows = torch.tensor([[1.0, 0.2, 0.9, -0.5, 0.3, 0.0], [0.1, 0.4, -0.2, 0.8, 1.1, 0.5]])
    probs = torch.softmax(rows, dim=-1)
    wrong = torch.multinomial(probs[1], DRAWS, replacement=True,
                              generator=torch.Generator().manual_seed(3))
    assert _chi_square(wrong, probs[0]) > CRITICAL[5]
