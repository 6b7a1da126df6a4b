"""LLaVA's image encoder: a vision tower's features at the configured layer(s) (the class
token dropped under the "default" strategy), carried into the language model's embedding space
by a two-layer projector. Each image becomes a fixed number of rows that take the places of
its placeholder tokens in the prompt."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.engine.models.source import ModelLoadError
from tokenmill.engine.models.vision_encoder import CLIP, VisionTransformer, activation


class Projector(nn.Module):
    def __init__(self, config: Any, in_features: int):
        super().__init__()
        text = config.text_config.hidden_size
        bias = getattr(config, "multimodal_projector_bias", True)
        self.linear_1 = nn.Linear(in_features, text, bias=bias)
        self.act = activation(config.projector_hidden_act, "projector_hidden_act")
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaImageEncoder(nn.Module):
    """Pixel values [images, 3, H, W] in, [images, tokens_per_image, text hidden] out."""

    def __init__(self, config: Any):
        super().__init__()
        layers = config.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else list(layers)
        strategy = config.vision_feature_select_strategy
        if strategy not in ("default", "full"):
            raise ModelLoadError(f"vision_feature_select_strategy {strategy!r} is not "
                                 "supported; tokenmill runs 'default' and 'full'")
        vision = config.vision_config
        self.vision_tower = VisionTransformer(vision, layers)
        # "default" drops the first row, a class token's or (SigLIP's, as transformers does)
        # the first patch's.
        self.drop_first = strategy == "default"
        self.multi_modal_projector = Projector(config, vision.hidden_size * len(layers))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.vision_tower(pixel_values)
        if self.drop_first:
            features = [f[:, 1:] for f in features]
        return self.multi_modal_projector(torch.cat(features, dim=-1))


def tokens_per_image(config: Any) -> int:
    """How many rows (placeholder tokens) one image becomes: a row per patch and CLIP's class
    token, less the first under the "default" strategy."""
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    return (patches + int(vision.model_type == CLIP)
            - int(config.vision_feature_select_strategy == "default"))


def image_token_id(config: Any) -> int:
    """The placeholder token an image's rows replace."""
    return int(getattr(config, "image_token_id", None) or config.image_token_index)
