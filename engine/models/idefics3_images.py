"""Idefics 3's and SmolVLM's image encoder: the processor resizes an image and cuts it into a
grid of square tiles, plus the whole image shrunk to one tile (none where it is small); a
SigLIP tower reads each tile, every scale x scale block of its patch features is folded into
one (pixel shuffle) and projected. The prompt holds each tile's rows after a
`<fake_token_around_image><row_R_col_C>` pair, a line break after each row of tiles, then
the whole image's after `<fake_token_around_image><global-img>`, closed by
`<fake_token_around_image>`: the processor's text, tokenized. Modules carry the checkpoints'
names (`vision_model.encoder.layers.N`, `connector.modality_projection.proj`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.engine.models.vision_encoder import VisionTransformer, pixel_shuffle

TOWERS = ("idefics3_vision", "smolvlm_vision")


class ModalityProjection(nn.Module):
    def __init__(self, width: int, out: int):
        super().__init__()
        self.proj = nn.Linear(width, out, bias=False)


class Connector(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.scale = int(config.scale_factor)
        width = config.vision_config.hidden_size * self.scale * self.scale
        self.modality_projection = ModalityProjection(width, config.text_config.hidden_size)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        n, patches, dim = features.shape
        side = int(patches ** 0.5)
        folded = pixel_shuffle(features.reshape(n, side, side, dim), self.scale)
        return self.modality_projection.proj(folded.reshape(n, -1, folded.shape[-1]))


class Idefics3ImageEncoder(nn.Module):
    """(one image's tiles [n, 3, S, S], the whole image's last) -> its rows, tile by tile."""

    def __init__(self, config: Any):
        super().__init__()
        vision = config.vision_config
        self.vision_model = VisionTransformer(vision, [-1], final_norm=True)
        self.connector = Connector(config)
        self.side = vision.image_size // vision.patch_size

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        features = self.vision_model(tiles, bucketed_positions(self.side))[0]
        return self.connector(features).flatten(0, 1)


def bucketed_positions(side: int) -> torch.Tensor:
    """The position table's row of each patch of a whole tile, found as Idefics 3 finds them
    for a tile of any size (each patch's fractional coordinates put in buckets), whose float
    rounding can move a patch off its index."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    step = 1.0 / torch.tensor(side)  # float32, as transformers divides
    fractions = (torch.arange(side, dtype=torch.float32) * step).clamp(max=1.0 - 1e-6)
    coords = torch.bucketize(fractions, boundaries, right=True)
    return (coords[:, None] * side + coords[None, :]).flatten()


def rows_per_tile(config: Any) -> int:
    """How many rows one tile becomes: its patches, folded."""
    vision = config.vision_config
    return (vision.image_size // vision.patch_size) ** 2 // int(config.scale_factor) ** 2


def image_text(config: Any, tokenizer: Any, grid: tuple[int, int]) -> str:
    """The text the processor writes for an image cut into grid (rows, columns) of tiles
    ((0, 0): not cut)."""
    fake = getattr(tokenizer, "fake_image_token", None) or "<fake_token_around_image>"
    image = getattr(tokenizer, "image_token", None) or "<image>"
    whole = getattr(tokenizer, "global_image_token", None) or "<global-img>"
    rows = image * rows_per_tile(config)
    tail = f"{fake}{whole}{rows}{fake}"
    if grid == (0, 0):
        return tail
    lines = ["".join(f"{fake}<row_{r + 1}_col_{c + 1}>{rows}" for c in range(grid[1])) + "\n"
             for r in range(grid[0])]
    return "".join(lines) + "\n" + tail
