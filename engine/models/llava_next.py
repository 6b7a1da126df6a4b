"""LLaVA-NeXT's image encoder ("anyres"): the processor cuts an image into a base view and
the tiles of the grid resolution that fits it best; the tower's features of each (LLaVA's
feature layer and projector) are laid out as one grid, the padding the resize added is cut
away, a learned newline row ends each line of it, and the base view's rows come first. So an
image's row count depends on its size (`image_rows`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.engine.models.llava import LlavaImageEncoder


def best_resolution(size: tuple[int, int], pinpoints: list) -> tuple[int, int]:
    """The grid resolution (height, width) that keeps most of an image of `size` (height,
    width) once scaled into it, and of equals the one that wastes least."""
    height, width = size
    best, kept_most, wasted_least = None, 0, float("inf")
    for grid_height, grid_width in pinpoints:
        scale = min(grid_width / width, grid_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = grid_width * grid_height - kept
        if kept > kept_most or (kept == kept_most and wasted < wasted_least):
            best, kept_most, wasted_least = (grid_height, grid_width), kept, wasted
    return best


def unpadded_extent(size: tuple[int, int], height: int, width: int) -> tuple[slice, slice]:
    """The rows and columns of a (height x width) feature grid that the image of `size` covers
    once the resize's padding (centred, along one side) is cut away."""
    original_height, original_width = size
    if original_width / original_height > width / height:
        kept = int(round(original_height * (width / original_width), 7))
        pad = (height - kept) // 2
        return slice(pad, height - pad), slice(0, width)
    kept = int(round(original_width * (height / original_height), 7))
    pad = (width - kept) // 2
    return slice(0, height), slice(pad, width - pad)


class LlavaNextImageEncoder(LlavaImageEncoder):
    """(pixel values [views, 3, H, W], the image's original size) -> its rows."""

    def __init__(self, config: Any):
        super().__init__(config)
        self.image_newline = nn.Parameter(torch.empty(config.text_config.hidden_size))
        self.pinpoints = [tuple(p) for p in config.image_grid_pinpoints]
        self.view_size = config.vision_config.image_size
        self.side = config.vision_config.image_size // config.vision_config.patch_size

    def grid(self, size: tuple[int, int]) -> tuple[int, int, slice, slice]:
        """Tiles down and across, and the unpadded extent of their joined feature grid."""
        height, width = best_resolution(size, self.pinpoints)
        down, across = height // self.view_size, width // self.view_size
        rows, cols = unpadded_extent(size, down * self.side, across * self.side)
        return down, across, rows, cols

    def image_rows(self, size: tuple[int, int]) -> int:
        _, _, rows, cols = self.grid(size)
        kept_rows = rows.stop - rows.start
        return self.side * self.side + kept_rows * (cols.stop - cols.start + 1)

    def forward(self, pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        down, across, rows, cols = self.grid(size)
        features = super().forward(pixels[:1 + down * across])  # [views, side^2, hidden]
        base, tiles = features[0], features[1:]
        hidden = tiles.shape[-1]
        grid = (tiles.view(down, across, self.side, self.side, hidden)
                .permute(0, 2, 1, 3, 4).reshape(down * self.side, across * self.side, hidden))
        grid = grid[rows, cols]
        newline = self.image_newline.to(grid.dtype).expand(grid.shape[0], 1, hidden)
        return torch.cat([base, torch.cat([grid, newline], dim=1).reshape(-1, hidden)])
