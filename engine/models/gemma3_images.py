"""Gemma 3's image encoder: SigLIP's last hidden state (after its final norm), averaged over
square windows of patches down to `mm_tokens_per_image` rows (256), normalized as Gemma
normalizes (times 1 + weight, in float32) and carried into the language model's space by one
matrix."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.vision_encoder import VisionTransformer, rms_normalized


class SoftEmbeddingNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalized(x, self.eps) * (1.0 + self.weight.float())).type_as(x)


class Gemma3Projector(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        vision = config.vision_config
        self.patches_per_side = vision.image_size // vision.patch_size
        self.kernel = self.patches_per_side // int(config.mm_tokens_per_image ** 0.5)
        self.mm_soft_emb_norm = SoftEmbeddingNorm(vision.hidden_size, vision.layer_norm_eps)
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vision.hidden_size, config.text_config.hidden_size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        images, _, dim = features.shape
        grid = features.transpose(1, 2).reshape(images, dim, self.patches_per_side,
                                                self.patches_per_side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled),
                            self.mm_input_projection_weight).type_as(features)


class Gemma3ImageEncoder(nn.Module):
    """Pixel values [images, 3, H, W] in, [images, mm_tokens_per_image, text hidden] out."""

    def __init__(self, config: Any):
        super().__init__()
        self.vision_tower = VisionTransformer(config.vision_config, [-1], final_norm=True)
        self.multi_modal_projector = Gemma3Projector(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixel_values)[0])
