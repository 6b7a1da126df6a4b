"""Embeddings' share of a step: the sum of each requested range of hidden-state rows, in
float32, brought to the host in one copy. The core turns the sums into embeddings (the last
token's row, the first's, or the mean over a prompt's chunks).

A sequence classifier's sums pass through its head first (`score`, one row per label): the
head is linear, so the core's mean of projected sums is the projection of the mean."""

from __future__ import annotations

import torch
from torch import nn


def sum_spans(hidden: torch.Tensor, spans: list[tuple[int, int]],
              head: nn.Linear | None = None) -> torch.Tensor:
    """[len(spans), hidden] float32 on the host (with `head`: [len(spans), labels]): row i
    sums hidden[start:end] of span i."""
    sums = torch.stack([hidden[start:end].float().sum(dim=0) for start, end in spans])
    if head is not None:
        sums = sums @ head.weight.float().t()
    return sums.cpu()
