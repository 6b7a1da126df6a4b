"""Temperature, top-k, top-p and min-p keep exactly the tokens transformers' logits warpers
keep (top-p over the top-k set renormalized, as `generate` and vLLM apply it; a token on a
threshold within float32's rounding may fall either side), whether the
candidates grow on the host (CPU) or the vocabulary is sorted (as on a GPU), and a row draws
from them with the probabilities the warpers leave."""

from __future__ import annotations

import pytest
import torch
from sampling_support import assert_kept_as_transformers, hf_filtered

from tokenmill.engine.core import sampler, sampling_filters
from tokenmill.engine.core.request import RequestTimings, Sequence
from tokenmill.engine.core.sampler import sample
from tokenmill.engine.core.sampling_filters import candidates
from tokenmill.engine.core.sampling_params import SamplingParams

VOCAB = 1000
FILTERS = [
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.05),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.8),  # Qwen3's recommended settings
    SamplingParams(temperature=1.0, top_k=100, top_p=0.95, min_p=0.02),
    SamplingParams(temperature=0.9, top_p=0.99, min_p=0.001),
    SamplingParams(temperature=1.0, top_p=0.999),
    SamplingParams(temperature=1.0, top_k=5000, top_p=0.5),  # top_k past the vocabulary
    SamplingParams(temperature=2.0, top_k=1),
]


def _logits(seed: int) -> torch.Tensor:
    """Rows of every shape a model gives: peaked, flat (top-p keeps most of the vocabulary,
    past the first candidates), and with tokens masked at -inf."""
    generator = torch.Generator().manual_seed(seed)
    peaked = torch.randn(len(FILTERS), VOCAB, generator=generator) * 4
    flat = torch.randn(len(FILTERS), VOCAB, generator=generator) * 0.05
    masked = torch.randn(len(FILTERS), VOCAB, generator=generator) * 2
    masked[:, ::3] = float("-inf")
    return torch.cat([peaked, flat, masked])


@pytest.mark.parametrize("adaptive", [True, False], ids=["cpu-growing", "gpu-sorting"])
def test_kept_tokens_equal_transformers_warpers(monkeypatch, adaptive):
    if not adaptive:
        monkeypatch.setattr(sampling_filters, "ADAPTIVE_DEVICES", ())
    params = FILTERS * 3
    for seed in range(4):
        logits = _logits(seed)
        kept = candidates(logits, params).scattered(VOCAB)
        for row, p in enumerate(params):
            assert_kept_as_transformers(kept[row], logits[row], p)


def test_growing_candidates_cover_a_flat_distribution():
    """top-p 0.999 over near-equal logits keeps nearly the whole vocabulary: far more than
    the first candidates, so they grow until the set fits."""
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)) * 0.01
    params = SamplingParams(temperature=1.0, top_p=0.999)
    kept = candidates(logits, [params])
    count = int(kept.logits.isfinite().sum())
    assert count > 4 * sampling_filters.FIRST_CANDIDATES
    assert_kept_as_transformers(kept.scattered(VOCAB)[0], logits[0], params)


def test_a_row_without_filters_keeps_the_whole_vocabulary_in_order():
    logits = torch.randn(2, VOCAB)
    kept = candidates(logits, [SamplingParams(temperature=0.5)] * 2)
    assert kept.ids is None
    torch.testing.assert_close(kept.logits, logits / 0.5)


@pytest.mark.parametrize("device_like", ["cpu", "gpu"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_k=6, top_p=0.9),
                                    SamplingParams(temperature=1.3)],
                         ids=["top-k-top-p", "temperature"])
def test_draws_follow_the_warped_distribution(monkeypatch, device_like, params):
    """20,000 draws of one row (unseeded rows share a generator), with the CPU's candidates and
    draw (inverse of the cumulative distribution) and the GPU's (the whole vocabulary sorted,
    the exponential race): each token's frequency is its probability after the warpers, within
    five standard errors."""
    if device_like == "gpu":
        monkeypatch.setattr(sampling_filters, "ADAPTIVE_DEVICES", ())
        monkeypatch.setattr(sampler, "INVERSE_CDF_DEVICES", ())
    draws = 20_000
    logits = torch.tensor([[2.0, 1.5, 1.2, 1.0, 0.2, 0.1, 0.0, -1.0] + [-3.0] * 24])
    seqs = [Sequence(i, f"r{i}", 0, [1], params, None, None, RequestTimings())
            for i in range(draws)]
    tokens = sample(logits.expand(draws, -1).contiguous(), seqs,
                    torch.Generator().manual_seed(0)).token_ids
    expected = hf_filtered(logits[0], params).softmax(dim=-1)
    counts = torch.bincount(torch.tensor(tokens), minlength=logits.shape[1]).double() / draws
    assert set(tokens) == set(expected.nonzero().flatten().tolist())
    tolerance = 5 * (expected * (1 - expected) / draws).sqrt() + 1e-9
    assert bool(((counts - expected).abs() <= tolerance).all()), (counts, expected)
