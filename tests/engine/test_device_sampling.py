"""The batched sampler equals sampling each row on its own, and brings its results to the host
in one transfer (on a GPU every transfer waits for the queued work)."""

from __future__ import annotations

import pytest
import torch
from engine_support import record_host_reads
from sampling_support import hf_filtered

from tokenmill.engine.core import sampler, sampling_filters
from tokenmill.engine.core.request import RequestTimings, Sequence
from tokenmill.engine.core.sampler import apply_penalties, sample
from tokenmill.engine.core.sampling_params import SamplingParams

VOCAB = 300

PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, seed=11),
    SamplingParams(temperature=1.0, top_k=20, seed=12, logprobs=3),
    SamplingParams(temperature=1.2, top_p=0.7, seed=13),
    SamplingParams(temperature=0.7, min_p=0.2, seed=14, logprobs=0),
    SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.3),
    SamplingParams(temperature=0.9, presence_penalty=0.5, frequency_penalty=0.4, seed=15),
    SamplingParams(temperature=1.0, top_k=1, seed=16),
]


def _seqs(params: list[SamplingParams]) -> list[Sequence]:
    seqs = []
    for i, p in enumerate(params):
        generator = None if p.seed is None else torch.Generator().manual_seed(p.seed)
        seq = Sequence(i, f"r{i}", 0, [3, 7, 7, 20 + i], p, generator, None, RequestTimings())
        seq.output_token_ids = [7, 9, 9, 9, 40 + i]
        seqs.append(seq)
    return seqs


def _one_row(logits: torch.Tensor, seq: Sequence,
             inverse_cdf: bool) -> tuple[int, dict[int, float] | None]:
    """The plain per-row form of the same rules, with transformers' logits warpers for
    temperature, top-k, top-p and min-p: the oracle."""
    raw = torch.log_softmax(logits, dim=-1)
    logits = logits.clone()
    if seq.params.has_penalties:
        apply_penalties(logits, seq)
    if seq.params.greedy:
        token = int(logits.argmax())
    else:
        probs = hf_filtered(logits, seq.params).softmax(dim=-1)
        if inverse_cdf:  # the first token whose cumulative probability passes a uniform point
            cumulative = probs.double().cumsum(dim=0)
            point = torch.rand(1, generator=seq.generator, dtype=torch.float64) * cumulative[-1]
            token = int((cumulative <= point).sum())
        else:  # the exponential race
            noise = torch.empty(VOCAB).exponential_(generator=seq.generator)
            token = int((probs / noise).argmax())
    k = seq.params.logprobs
    if k is None:
        return token, None
    values, ids = raw.topk(k) if k else (torch.empty(0), torch.empty(0, dtype=torch.long))
    entry = dict(zip(ids.tolist(), values.tolist(), strict=True))
    entry[token] = float(raw[token])
    return token, dict(sorted(entry.items(), key=lambda kv: -kv[1]))


@pytest.mark.parametrize("inverse_cdf", [True, False], ids=["cpu-inverse-cdf", "gpu-race"])
def test_batched_sampling_equals_each_row_alone(monkeypatch, inverse_cdf):
    if not inverse_cdf:
        monkeypatch.setattr(sampler, "INVERSE_CDF_DEVICES", ())
    logits = torch.randn(len(PARAMS), VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    result = sample(logits, _seqs(PARAMS))
    expected = [_one_row(logits[i], s, inverse_cdf) for i, s in enumerate(_seqs(PARAMS))]
    assert result.token_ids == [t for t, _ in expected]
    assert result.logprobs == [lp for _, lp in expected]
    # Greedy rows (temperature 0, top_k 1) take the argmax of the penalized logits.
    assert result.token_ids[0] == int(logits[0].argmax())
    assert result.token_ids[7] == int(logits[7].argmax())


def test_unseeded_rows_share_the_given_generator_and_reproduce_with_it():
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9),
              SamplingParams(temperature=1.0, seed=3)]
    logits = torch.zeros(3, VOCAB)  # uniform: the draw is the noise alone
    first = sample(logits, _seqs(params), torch.Generator().manual_seed(1)).token_ids
    again = sample(logits, _seqs(params), torch.Generator().manual_seed(1)).token_ids
    other = sample(logits, _seqs(params), torch.Generator().manual_seed(2)).token_ids
    assert first == again
    assert first[:2] != other[:2] and first[2] == other[2]  # the seeded row keeps its own draw


@pytest.mark.parametrize("with_logprobs", [False, True])
def test_one_host_transfer_per_step(monkeypatch, with_logprobs):
    # As on a GPU: the candidates of rows without top-k do not grow by reading the kept sets,
    # and rows draw by the exponential race.
    monkeypatch.setattr(sampling_filters, "ADAPTIVE_DEVICES", ())
    monkeypatch.setattr(sampler, "INVERSE_CDF_DEVICES", ())
    reads = record_host_reads(monkeypatch)
    params = [p if with_logprobs else p.__class__(**{**vars(p), "logprobs": None})
              for p in PARAMS]
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(4))
    seqs = _seqs(params)
    reads.clear()
    sample(logits, seqs)
    assert reads == ["tolist"]
