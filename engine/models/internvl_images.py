"""InternVL's image encoder (InternVL 3 and 3.5 in transformers' layout): the processor cuts an
image into square tiles by its aspect ratio (and adds a thumbnail of the whole where it cut
more than one); InternViT reads each tile (a class token, learned positions, layers scaled
by learned factors), every 2 x 2 of its patch features are folded into one (pixel shuffle),
and a normed two-layer projector makes them rows. The prompt holds an image as `<img>`, its
tiles' rows of `<IMG_CONTEXT>`, `</img>`. Modules carry the checkpoints' names
(`vision_tower.encoder.layer.N.attention.q_proj`, `multi_modal_projector.linear_1`, ...)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.source import ModelLoadError
from tokenmill.engine.models.vision_encoder import RMSNorm, activation, pixel_shuffle


def _norm(config: Any) -> nn.Module:
    if config.norm_type == "rms_norm":
        return RMSNorm(config.hidden_size, config.layer_norm_eps)
    if config.norm_type != "layer_norm":
        raise ModelLoadError(f"vision_config.norm_type {config.norm_type!r} is not supported "
                             "(layer_norm, rms_norm)")
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class PatchEmbeddings(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size,
                                    kernel_size=config.patch_size, stride=config.patch_size)


class Embeddings(nn.Module):
    """Patches, a class token before them, and a learned position for each."""

    def __init__(self, config: Any):
        super().__init__()
        side = _side(config.image_size) // _side(config.patch_size)
        self.cls_token = nn.Parameter(torch.empty(1, 1, config.hidden_size))
        self.patch_embeddings = PatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(torch.empty(1, side * side + 1,
                                                            config.hidden_size))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        conv = self.patch_embeddings.projection
        x = conv(pixels.to(conv.weight.dtype)).flatten(2).transpose(1, 2)
        if x.shape[1] + 1 != self.position_embeddings.shape[1]:
            raise ValueError(f"tiles of {tuple(pixels.shape[-2:])} pixels; InternViT reads its "
                             "own image_size")
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.position_embeddings


class Attention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        dim, bias = config.hidden_size, config.attention_bias
        self.heads = config.num_attention_heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=bias), nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.projection_layer = nn.Linear(dim, dim)
        # InternViT-6B normalizes q and k over every head at once.
        self.q_norm = RMSNorm(dim, 1e-6) if config.use_qk_norm else nn.Identity()
        self.k_norm = RMSNorm(dim, 1e-6) if config.use_qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, -1).transpose(1, 2)

        q = heads(self.q_norm(self.q_proj(x)))
        k = heads(self.k_norm(self.k_proj(x)))
        out = F.scaled_dot_product_attention(q, k, heads(self.v_proj(x)))
        return self.projection_layer(out.transpose(1, 2).reshape(batch, length, dim))


class MLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act, "vision_config.hidden_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.attention = Attention(config)
        self.mlp = MLP(config)
        self.layernorm_before, self.layernorm_after = _norm(config), _norm(config)
        self.lambda_1 = nn.Parameter(torch.empty(config.hidden_size))
        self.lambda_2 = nn.Parameter(torch.empty(config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lambda_1 * self.attention(self.layernorm_before(x)) + x
        return self.lambda_2 * self.mlp(self.layernorm_after(x)) + x


class Encoder(nn.Module):
    def __init__(self, config: Any, num_layers: int):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(num_layers))


class InternViT(nn.Module):
    """Tiles [n, 3, S, S] -> features [n, 1 + patches, hidden] after `num_layers` layers (and
    the final norm where the tower's output is read, `last`, and it has one)."""

    def __init__(self, config: Any, num_layers: int, last: bool):
        super().__init__()
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config, num_layers)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) \
            if last and not config.use_mean_pooling else None

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layer:
            x = layer(x)
        return x if self.layernorm is None else self.layernorm(x)


class Projector(nn.Module):
    def __init__(self, config: Any, width: int):
        super().__init__()
        text = config.text_config.hidden_size
        self.layer_norm = nn.LayerNorm(width)
        self.linear_1 = nn.Linear(width, text)
        self.act = activation(config.projector_hidden_act, "projector_hidden_act")
        self.linear_2 = nn.Linear(text, text)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(self.layer_norm(x))))


class InternVLImageEncoder(nn.Module):
    """(one image's tiles [n, 3, S, S]) -> its rows [n * rows per tile, text hidden]."""

    def __init__(self, config: Any):
        super().__init__()
        vision = config.vision_config
        layer = config.vision_feature_layer
        if not isinstance(layer, int):
            raise ModelLoadError(f"vision_feature_layer: InternVL reads one layer, not {layer!r}")
        self.fold = round(1 / config.downsample_ratio)
        if self.fold * config.downsample_ratio != 1:
            raise ModelLoadError(f"downsample_ratio {config.downsample_ratio} does not fold "
                                 "whole blocks of patches")
        # -1 reads the tower's output (after its norm); another index, that layer's.
        self.vision_tower = InternViT(vision, layer % (vision.num_hidden_layers + 1),
                                      last=layer == -1)
        self.drop_first = config.vision_feature_select_strategy == "default"
        width = vision.hidden_size * self.fold * self.fold
        self.multi_modal_projector = Projector(config, width)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        features = self.vision_tower(tiles)
        if self.drop_first:
            features = features[:, 1:]
        side = int(features.shape[1] ** 0.5)
        folded = pixel_shuffle(features.reshape(tiles.shape[0], side, side, -1), self.fold)
        rows = self.multi_modal_projector(folded.reshape(tiles.shape[0], -1, folded.shape[-1]))
        return rows.flatten(0, 1)


def rows_per_tile(config: Any) -> int:
    """How many rows one tile becomes: its patches, folded."""
    vision = config.vision_config
    side = _side(vision.image_size) // _side(vision.patch_size)
    return round(side * side * config.downsample_ratio ** 2)


def _side(size: Any) -> int:
    """A square size given as a number or a pair."""
    return int(size[0]) if isinstance(size, (list, tuple)) else int(size)
