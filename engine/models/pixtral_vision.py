"""Pixtral's vision transformer (Mistral Small 3.1's tower): an image of any size becomes its
grid of patches, normalized, through layers of attention turned by a 2-D rotary embedding
(each patch's row and column) and gated MLPs. Images run one at a time: each attends only to
itself. Modules carry the checkpoints' names."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.vision_encoder import RMSNorm, activation


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class PixtralAttention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        length, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(length, self.num_heads, -1).transpose(0, 1)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q[None], k[None], v[None])[0]
        return self.o_proj(out.transpose(0, 1).reshape(length, dim))


class PixtralMLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        dim, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(dim, inner, bias=False)
        self.up_proj = nn.Linear(dim, inner, bias=False)
        self.down_proj = nn.Linear(inner, dim, bias=False)
        self.act = activation(config.hidden_act, "vision hidden_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PixtralLayer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, 1e-5)
        self.attention = PixtralAttention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, 1e-5)
        self.feed_forward = PixtralMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class PixtralTransformer(nn.Module):
    def __init__(self, config: Any, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(PixtralLayer(config) for _ in range(num_layers))


class PixtralVision(nn.Module):
    """One image's pixels [3, H, W] (H and W multiples of the patch) -> the hidden states
    after the last of the layers built, one row per patch, row-major."""

    def __init__(self, config: Any, num_layers: int):
        super().__init__()
        self.patch_size = config.patch_size
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.rope_theta = float(config.rope_parameters["rope_theta"])
        self.patch_conv = nn.Conv2d(config.num_channels, config.hidden_size,
                                    kernel_size=self.patch_size, stride=self.patch_size,
                                    bias=False)
        self.ln_pre = RMSNorm(config.hidden_size, 1e-5)
        self.transformer = PixtralTransformer(config, num_layers)

    def rotary(self, rows: int, cols: int, device: torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [patches, head_dim]: a quarter of the frequencies turn by the patch's
        row, the next quarter by its column, repeated over the head's two halves."""
        dim = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, device=device,
                                                            dtype=torch.float) / dim))
        by_row, by_col = inv_freq[0::2], inv_freq[1::2]
        row = torch.arange(rows, device=device, dtype=torch.float).repeat_interleave(cols)
        col = torch.arange(cols, device=device, dtype=torch.float).repeat(rows)
        angles = torch.cat([row[:, None] * by_row, col[:, None] * by_col], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        grid = self.patch_conv(pixels[None].to(self.patch_conv.weight.dtype))[0]
        rows, cols = grid.shape[-2:]
        x = self.ln_pre(grid.flatten(1).T)
        cos, sin = self.rotary(rows, cols, x.device, x.dtype)
        for layer in self.transformer.layers:
            x = layer(x, cos, sin)
        return x
