"""Projections of the same input merged into one matmul (q/k/v, gate/up).

One larger matmul per layer instead of two or three small ones: on CPU the small ones leave
the cores idle between calls. Checkpoints still name the parts, so each part is exposed as a
row block (a view) of the merged weight and loading writes straight into it.
"""

from __future__ import annotations

import torch
from torch import nn


def linear_output(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A weight-only quantized layer's [rows, out] result in x's dtype and leading shape, with
    the (unquantized) bias added."""
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    if bias is not None:
        y = y + bias
    # A reshape dispatches an op even when the shape is already right (the model's 2-D rows).
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


class SplitParts:
    """For a merged layer's quantized twins: `forward` returns the declared parts' outputs,
    `forward_merged` the whole output of the class it is mixed into (listed after it)."""

    parts: dict[str, int]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.forward_merged(x).split(list(self.parts.values()), dim=-1)

    def forward_merged(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)  # type: ignore[misc]


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, parts: dict[str, int], bias: bool):
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The parts' outputs, in the order they were declared."""
        return self.forward_merged(x).split(list(self.parts.values()), dim=-1)

    def forward_merged(self, x: torch.Tensor) -> torch.Tensor:
        """The parts' outputs side by side, one tensor (a LoRA delta is added to it whole)."""
        return super().forward(x)

    def part_tensors(self) -> dict[str, torch.Tensor]:
        """{"q_proj.weight": view, ...}: each part's rows of the merged weight and bias."""
        sizes = list(self.parts.values())
        views = {}
        for kind in ("weight", "bias"):
            merged = getattr(self, kind)
            if merged is None:
                continue
            for name, view in zip(self.parts, merged.split(sizes, dim=0), strict=True):
                views[f"{name}.{kind}"] = view
        return views
