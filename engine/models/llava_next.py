"""LLaVA-NeXT's image encoder ("anyres"): the processor cuts an image into a base view and
the tiles of the grid resolution that fits it best; the tower's features of each (LLaVA's
feature layer and projector) are laid out as one grid, the padding the resize added is cut
away, a learned newline row ends each line of it, and the base view's rows come first. So an
image's row count depends on its size (`image_rows`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
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

    def grid(self, size: tuple[int, ...]) -> tuple[int, int, slice, slice]:
        """Tiles down and across, and the unpadded extent of their joined feature grid."""
        size = (size[0], size[1])
        height, width = best_resolution(size, self.pinpoints)
        down, across = height // self.view_size, width // self.view_size
        rows, cols = unpadded_extent(size, down * self.side, across * self.side)
        return down, across, rows, cols

    def fitted(self, height: int, width: int) -> tuple[int, int] | None:
        """The size an unpadded grid of height x width rows is resampled to, None: kept as it
        is (LLaVA-OneVision shrinks large ones)."""
        return None

    def image_rows(self, size: tuple[int, ...]) -> int:
        _, _, rows, cols = self.grid(size)
        height, width = rows.stop - rows.start, cols.stop - cols.start
        height, width = self.fitted(height, width) or (height, width)
        return self.side * self.side + height * (width + 1)

    def forward(self, pixels: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
        down, across, rows, cols = self.grid(size)
        features = LlavaImageEncoder.forward(self, pixels[:1 + down * across])
        base, tiles = features[0], features[1:]  # [side^2, hidden], [tiles, side^2, hidden]
        hidden = tiles.shape[-1]
        grid = (tiles.view(down, across, self.side, self.side, hidden)
                .permute(0, 2, 1, 3, 4).reshape(down * self.side, across * self.side, hidden))
        grid = grid[rows, cols]
        fitted = self.fitted(*grid.shape[:2])
        if fitted is not None:
            grid = F.interpolate(grid.permute(2, 0, 1)[None], list(fitted),
                                 mode="bilinear")[0].permute(1, 2, 0)
        newline = self.image_newline.to(grid.dtype).expand(grid.shape[0], 1, hidden)
        return torch.cat([base, torch.cat([grid, newline], dim=1).reshape(-1, hidden)])
