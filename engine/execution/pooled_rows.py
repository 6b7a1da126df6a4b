"""Embeddings' share of a step: the sum of each requested range of hidden-state rows, in
float32, brought to the host in one copy. The core turns the sums into embeddings (the last
token's row, the first's, or the mean over a prompt's chunks).

A sequence classifier's sums pass through its head first (`score`): a decoder's is one
linear row per label, so the core's mean of projected sums is the projection of the mean; an
encoder's (dense, tanh, out) reads one row, the first token's, in float32."""

from __future__ import annotations

import torch
from torch import nn


def sum_spans(hidden: torch.Tensor, spans: list[tuple[int, int]],
              head: nn.Module | None = None) -> torch.Tensor:
    """[len(spans), hidden] float32 on the host (with `head`: [len(spans), labels]): row i
    sums hidden[start:end] of span i."""
    sums = torch.stack([hidden[start:end].float().sum(dim=0) for start, end in spans])
    if isinstance(head, nn.Linear):
        sums = sums @ head.weight.float().t()
    elif head is not None:
        sums = head(sums)
    return sums.cpu()
