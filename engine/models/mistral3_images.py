"""Mistral 3's image encoder (Mistral Small 3.1 and 3.2): Pixtral's tower over the image at
its own size, its patches normalized, every 2 x 2 of them merged into one by a learned layer,
then LLaVA's two-layer projector; and Pixtral 12B's (LLaVA over Pixtral's tower: a row per
patch, no merging). The prompt holds the rows line by line: each line of [IMG] tokens ends
with [IMG_BREAK], the last with [IMG_END]."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.llava import Projector
from tokenmill.engine.models.pixtral_vision import PixtralVision
from tokenmill.engine.models.source import ModelLoadError
from tokenmill.engine.models.vision_encoder import RMSNorm, activation


class PatchMerger(nn.Module):
    def __init__(self, dim: int, merge: int):
        super().__init__()
        self.merge = merge
        self.merging_layer = nn.Linear(dim * merge * merge, dim, bias=False)

    def forward(self, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        grid = x.view(rows, cols, -1).permute(2, 0, 1)[None]
        merged = F.unfold(grid, kernel_size=self.merge, stride=self.merge)[0]
        return self.merging_layer(merged.T)


class Mistral3Projector(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        bias = getattr(config, "multimodal_projector_bias", False)
        self.norm = RMSNorm(vision, config.text_config.rms_norm_eps)
        self.patch_merger = PatchMerger(vision, config.spatial_merge_size)
        self.linear_1 = nn.Linear(vision, text, bias=bias)
        self.act = activation(config.projector_hidden_act, "projector_hidden_act")
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        merged = self.patch_merger(self.norm(x), rows, cols)
        return self.linear_2(self.act(self.linear_1(merged)))


class Mistral3ImageEncoder(nn.Module):
    """(one image's pixels [3, H, W], H and W multiples of patch x merge) -> its rows, row-major
    over the merged grid."""

    def __init__(self, config: Any):
        super().__init__()
        self.vision_tower = PixtralVision(config.vision_config, _layers_read(config))
        self.multi_modal_projector = Mistral3Projector(config)
        self.patch_size = config.vision_config.patch_size

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        rows, cols = (side // self.patch_size for side in pixels.shape[-2:])
        return self.multi_modal_projector(self.vision_tower(pixels), rows, cols)


class PixtralImageEncoder(nn.Module):
    """Pixtral 12B's: (one image's pixels [3, H, W], H and W multiples of the patch) -> a row
    per patch, row-major, through LLaVA's projector."""

    def __init__(self, config: Any):
        super().__init__()
        if config.vision_feature_select_strategy != "full":
            raise ModelLoadError("vision_feature_select_strategy: Pixtral's tower has no class "
                                 f"token to drop; 'full' is read, not "
                                 f"{config.vision_feature_select_strategy!r}")
        self.vision_tower = PixtralVision(config.vision_config, _layers_read(config))
        self.multi_modal_projector = Projector(config, config.vision_config.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixels))


def _layers_read(config: Any) -> int:
    """How many of the tower's layers run: up to the one whose output is read (-1: all)."""
    layer = config.vision_feature_layer
    if not isinstance(layer, int):
        raise ModelLoadError("vision_feature_layer: Pixtral's tower is read at one layer here; "
                             f"{layer!r} names several")
    return layer % (config.vision_config.num_hidden_layers + 1)
