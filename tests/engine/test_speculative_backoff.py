"""The n-gram proposer's per-sequence back-off: drafts of which nothing is accepted pause that
sequence's proposals for longer and longer; an accepted token ends the pause."""

from __future__ import annotations

from tokenmill.engine.contract.speculative import SpeculativeConfig
from tokenmill.engine.core.request import RequestTimings, Sequence
from tokenmill.engine.core.sampling_params import SamplingParams
from tokenmill.engine.core.speculative.proposer import MAX_PAUSE, NgramProposer


def _seq() -> Sequence:
    params = SamplingParams(temperature=0.0, max_tokens=1000)
    return Sequence(1, "r", 0, [7, 8, 9] * 5, params, None, None, RequestTimings())


def test_rejected_drafts_pause_proposals_longer_each_time_and_acceptance_resets():
    proposer = NgramProposer(SpeculativeConfig("ngram", 3), max_model_len=4096)
    seq = _seq()
    assert proposer.propose(seq, 1) == [7, 8, 9]
    pauses = []
    for _ in range(6):  # each draft rejected: the step emits one token (the target's own)
        seq.output_token_ids.append(1)
        quiet = 0
        while not proposer.propose(seq, 1):
            quiet += 1
            seq.output_token_ids.append(1)
        pauses.append(quiet)
    assert pauses == [2, 4, 8, 16, 32, MAX_PAUSE]
    seq.output_token_ids += [7, 8, 9]  # two proposals accepted, then the target's token
    assert proposer.propose(seq, 1)
    seq.output_token_ids.append(1)  # rejected again: the pause starts over from 2
    assert not proposer.propose(seq, 1)
    seq.output_token_ids.append(1)
    assert not proposer.propose(seq, 1)
    seq.output_token_ids.append(1)
    assert proposer.propose(seq, 1) == [1, 1, 1]  # the run of 1s recurs


def test_a_released_sequence_starts_over():
    proposer = NgramProposer(SpeculativeConfig("ngram", 3), max_model_len=4096)
    seq = _seq()
    proposer.propose(seq, 1)
    seq.output_token_ids.append(7)
    assert proposer.propose(seq, 1) == []  # paused, though "7" recurs
    proposer.release(seq)
    assert proposer.propose(seq, 1) == [8, 9, 7]
