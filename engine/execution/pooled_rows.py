"""Embeddings' share of a step: the sum of each requested range of hidden-state rows, in
float32, brought to the host in one copy. The core turns the sums into embeddings (the last
token's row, the first's, or the mean over a prompt's chunks)."""

from __future__ import annotations

import torch


def sum_spans(hidden: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """[len(spans), hidden] float32 on the host: row i sums hidden[start:end] of span i."""
    sums = torch.stack([hidden[start:end].float().sum(dim=0) for start, end in spans])
    return sums.cpu()
