"""transformers' logits warpers as the reference for temperature, top-k, top-p and min-p."""

from __future__ import annotations

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
