"""Fixed sinusoidal position embeddings (fairseq's, which XGLM keeps): computed from the
config, not read from a checkpoint, and added to the token embeddings as a learned table's
rows would be."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoidal_table(rows: int, width: int, padding_row: int | None = None) -> torch.Tensor:
    """[rows, width]: row p holds sin(p * f_i) for the width // 2 frequencies
    f_i = 10000 ** (-i / (width // 2 - 1)), then their cosines (a zero column where the width
    is odd); the padding row is zeros."""
    half = width // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) /
                                                                         (half - 1)))
    angles = torch.arange(rows, dtype=torch.float32).unsqueeze(1) * frequencies.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if width % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    if padding_row is not None:
        table[padding_row] = 0
    return table


class SinusoidalPositions(nn.Module):
    """Called as an nn.Embedding of positions is; its table a buffer that the loader fills
    (fill_computed_buffers) on the model's device, in the model's dtype."""

    def __init__(self, rows: int, width: int, padding_row: int | None):
        super().__init__()
        self.padding_row = padding_row
        self.register_buffer("table", torch.empty(rows, width), persistent=False)

    def fill_computed_buffers(self) -> None:
        rows, width = self.table.shape
        self.table = sinusoidal_table(rows, width, self.padding_row).to(self.table)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return F.embedding(positions, self.table)
