"""LLaVA-OneVision's image encoder: LLaVA-NeXT's tiles, unpadding and newline rows, with two
differences. A grid with more feature rows than `vision_aspect_ratio` ("anyres_max_9": nine
views' worth) allows is shrunk bilinearly to fit; and an image that is one of several in its
prompt is read as its base view alone, with one newline row after it."""

from __future__ import annotations

import math
from typing import Any

import torch

from tokenmill.engine.models.llava import LlavaImageEncoder
from tokenmill.engine.models.llava_next import LlavaNextImageEncoder
from tokenmill.engine.models.source import ModelLoadError


class LlavaOnevisionImageEncoder(LlavaNextImageEncoder):
    """(pixel values [views, 3, H, W], (height, width, 1 where the image is one of several in
    its prompt else 0)) -> its rows."""

    def __init__(self, config: Any):
        super().__init__(config)
        aspect = str(getattr(config, "vision_aspect_ratio", "anyres_max_9"))
        count = aspect.removeprefix("anyres_max_")
        if count == aspect or not count.isdigit():
            raise ModelLoadError(f"vision_aspect_ratio {aspect!r} is not supported; tokenmill "
                                 "reads 'anyres_max_N'")
        self.max_views = int(count)

    def fitted(self, height: int, width: int) -> tuple[int, int] | None:
        ratio = math.sqrt(height * width / (self.max_views * self.side * self.side))
        return (int(height // ratio), int(width // ratio)) if ratio > 1.1 else None

    def image_rows(self, size: tuple[int, ...]) -> int:
        if size[2]:  # one of several: the base view and a newline row
            return self.side * self.side + 1
        return super().image_rows(size)

    def forward(self, pixels: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
        if size[2]:
            base = LlavaImageEncoder.forward(self, pixels[:1])[0]
            return torch.cat([base, self.image_newline.to(base.dtype)[None]])
        return super().forward(pixels, size)
