"""transformers' logits warpers as the reference for temperature, top-k, top-p and min-p."""

from __future__ import annotations

import dataclasses

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokenmill.engine.core.sampling_params import SamplingParams


def hf_filtered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One row's logits [vocab] through the warpers `generate` applies, in its order: over
    temperature, -inf where top-k, top-p or min-p drop the token."""
    scores = logits.float().unsqueeze(0)
    warpers = [TemperatureLogitsWarper(params.temperature)]
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(min(params.top_k, logits.shape[0])))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    if params.min_p > 0.0:
        warpers.append(MinPLogitsWarper(params.min_p))
    for warper in warpers:
        scores = warper(None, scores)
    return scores[0]


def at_a_threshold(logits: torch.Tensor, params: SamplingParams, token: int) -> bool:
    """Whether `token` of one row's logits sits on top-p's or min-p's edge within float32's
    rounding: transformers' mass below it (ascending, over the top-k set) is 1 - top_p, or its
    probability is min_p times the largest. Summed in another order (from the top, as a
    kept set grows), such a token can fall either side of the edge."""
    probs = hf_filtered(logits, dataclasses.replace(params, top_p=1.0, min_p=0.0)).softmax(-1)
    rounding = 4 * torch.finfo(torch.float32).eps
    if params.top_p < 1.0:
        ascending, order = probs.sort()
        mass = ascending.cumsum(dim=-1)[(order == token).nonzero().item()].item()
        if abs(mass - (1.0 - params.top_p)) <= rounding:
            return True
    largest = probs.max().item()
    return params.min_p > 0.0 and abs(probs[token].item() - params.min_p * largest) <= \
        rounding * largest


def assert_kept_as_transformers(kept: torch.Tensor, logits: torch.Tensor,
                                params: SamplingParams) -> None:
    """One row's kept logits (-inf where dropped) keep transformers' tokens, but for at most
    one on an edge (at_a_threshold), with the same values."""
    expected = hf_filtered(logits, params)
    differ = (kept.isfinite() != expected.isfinite()).nonzero().flatten().tolist()
    assert len(differ) <= 1 and all(at_a_threshold(logits, params, t) for t in differ), \
        (params, differ)
    both = kept.isfinite() & expected.isfinite()
    torch.testing.assert_close(kept[both], expected[both])
