"""Qwen2-VL's and Qwen2.5-VL's image encoder: the processor cuts an image, at its own size,
into patches of 2 frames x 14 x 14 pixels (a still image repeats its frame), ordered so that
each 2 x 2 block of neighbours is consecutive; a vision transformer with a 2-D rotary
embedding reads them, and a merger folds each block into one row of the language model's
width. Qwen2-VL's blocks are LayerNorm and a two-layer MLP, each attending over the whole
image; Qwen2.5-VL's are RMSNorm and a gated MLP, most attending only within windows of the
image (the others over all of it). Modules carry the checkpoints' names (`visual.blocks.N.
attn.qkv`, `visual.merger.mlp.0`, ...)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.vision_encoder import activation, rms_normalized

QWEN2_VL = ("qwen2_vl_vision", "qwen2_vl")
QWEN2_5_VL = ("qwen2_5_vl_vision", "qwen2_5_vl")
TOWERS = QWEN2_VL + QWEN2_5_VL
EPS = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalized(x, EPS).to(x.dtype)


def _norm(dim: int, rms: bool) -> nn.Module:
    return RMSNorm(dim) if rms else nn.LayerNorm(dim, eps=EPS)


class PatchEmbed(nn.Module):
    """A patch's pixels (channels x frames x height x width, flattened) to its features."""

    def __init__(self, config: Any, dim: int):
        super().__init__()
        size = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, dim, kernel_size=size, stride=size,
                              bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # The kernel covers the whole patch: the convolution is one matrix product.
        return F.linear(patches.to(self.proj.weight.dtype), self.proj.weight.flatten(1))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: list[int]) -> torch.Tensor:
        """x [n, dim]; rows attend within their segment (the image, or a window of it)."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)
        q, k = _rotated(q, cos, sin), _rotated(k, cos, sin)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, n, head_dim]
        return self.proj(_segment_attention(q, k, v, segments).transpose(0, 1).reshape(n, -1))


def _segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       segments: list[int]) -> torch.Tensor:
    """Attention within each segment of rows ([heads, n, head_dim] each): a run of segments
    of one length (a row of whole windows) in one batched call."""
    heads, _, head_dim = q.shape
    out, start = [], 0
    for length, run in itertools.groupby(segments):
        count = len(list(run))
        rows = slice(start, start + length * count)
        batch = [t[:, rows].reshape(heads, count, length, head_dim).transpose(0, 1)
                 for t in (q, k, v)]
        out.append(F.scaled_dot_product_attention(*batch).transpose(0, 1)
                   .reshape(heads, length * count, head_dim))
        start += length * count
    return torch.cat(out, dim=1)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x turned by its rows' angles, in float32 as the model was trained."""
    h = x.float()
    half = h.shape[-1] // 2
    turned = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
    return (h * cos + turned * sin).to(x.dtype)


class MLP(nn.Module):
    """Qwen2-VL's fc1, activation, fc2."""

    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.act = activation(act, "vision_config.hidden_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class GatedMLP(nn.Module):
    """Qwen2.5-VL's down(act(gate(x)) * up(x)), with biases."""

    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)
        self.act = activation(act, "vision_config.hidden_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: Any, dim: int, gated: bool):
        super().__init__()
        self.norm1, self.norm2 = _norm(dim, gated), _norm(dim, gated)
        self.attn = Attention(dim, config.num_heads)
        self.mlp = GatedMLP(dim, config.intermediate_size, config.hidden_act) if gated else \
            MLP(dim, int(dim * config.mlp_ratio), config.hidden_act)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class Merger(nn.Module):
    """Each 2 x 2 block of patch features, normed, concatenated and projected to one row."""

    def __init__(self, dim: int, out: int, merge: int, rms: bool):
        super().__init__()
        self.width = dim * merge * merge
        self.ln_q = _norm(dim, rms)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(),
                                 nn.Linear(self.width, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


def patch_positions(grid: tuple[int, int, int], merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's (row, column) in the image, in the processor's order: block by block of
    merge x merge neighbours, each frame alike."""
    frames, height, width = grid
    rows = torch.arange(height).view(-1, 1).expand(height, width)
    cols = torch.arange(width).view(1, -1).expand(height, width)
    shape = (height // merge, merge, width // merge, merge)
    rows, cols = (t.reshape(shape).transpose(1, 2).flatten().repeat(frames)
                  for t in (rows, cols))
    return rows, cols


def windows(grid: tuple[int, int, int], merge: int, side: int) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows of `side` x `side` merged blocks, from the image's top left (the
    last row and column of windows may be smaller): the order that puts each window's blocks
    together, and each window's patch count."""
    frames, height, width = grid[0], grid[1] // merge, grid[2] // merge
    order, sizes = [], []
    blocks = torch.arange(frames * height * width).view(frames, height, width)
    for frame in blocks:
        for top in range(0, height, side):
            for left in range(0, width, side):
                window = frame[top:top + side, left:left + side].flatten()
                order.append(window)
                sizes.append(window.numel() * merge * merge)
    return torch.cat(order), sizes


class QwenVisionTower(nn.Module):
    def __init__(self, config: Any, out: int, gated: bool):
        super().__init__()
        dim = config.hidden_size if gated else config.embed_dim
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, dim)
        self.blocks = nn.ModuleList(Block(config, dim, gated) for _ in range(config.depth))
        self.merger = Merger(dim, out, self.merge, gated)
        self.head_dim = dim // config.num_heads
        self.theta = float((getattr(config, "rope_parameters", None) or {}).get(
            "rope_theta", 1e4))
        # Qwen2.5-VL: the blocks that see the whole image (the others see windows of it).
        self.full_blocks = set(getattr(config, "fullatt_block_indexes", None) or []) \
            if gated else set(range(config.depth))
        self.window = config.window_size // self.merge // config.patch_size if gated else 0

    def rotary(self, grid: tuple[int, int, int],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, 1, head_dim] of each patch: half the frequencies turn by its row,
        half by its column."""
        half = self.head_dim // 2
        inv_freq = 1.0 / self.theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)
        rows, cols = patch_positions(grid, self.merge)
        angles = torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=-1)
        angles = torch.cat([angles, angles], dim=-1).to(device)[:, None]
        return angles.cos(), angles.sin()

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One image's patches [n, channels x frames x patch x patch] with its patch grid
        (frames, height, width) -> its rows [n / merge^2, out]."""
        cos, sin = self.rotary(grid, patches.device)
        x = self.patch_embed(patches)
        frame = grid[1] * grid[2]
        whole = [frame] * grid[0]
        order, by_window = None, whole
        if self.window:
            order, by_window = windows(grid, self.merge, self.window)
            unit = self.merge * self.merge
            order = order.to(x.device)
            # Blocks of merge x merge patches stay together: reorder block by block.
            x = x.view(-1, unit, x.shape[-1])[order].flatten(0, 1)
            cos = cos.view(-1, unit, *cos.shape[1:])[order].flatten(0, 1)
            sin = sin.view(-1, unit, *sin.shape[1:])[order].flatten(0, 1)
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, whole if index in self.full_blocks else by_window)
        merged = self.merger(x)
        if order is None:
            return merged
        return merged[torch.argsort(order)]


class QwenImageEncoder(nn.Module):
    """(one image's patches, its patch grid) -> its rows, for Qwen2-VL and Qwen2.5-VL."""

    def __init__(self, config: Any):
        super().__init__()
        vision = config.vision_config
        gated = vision.model_type in QWEN2_5_VL
        out = vision.out_hidden_size if gated else vision.hidden_size
        self.visual = QwenVisionTower(vision, out, gated)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        return self.visual(patches, grid)


def rows_of(config: Any, grid: tuple[int, int, int]) -> int:
    """How many rows an image of this patch grid becomes."""
    merge = config.vision_config.spatial_merge_size
    return grid[0] * grid[1] * grid[2] // (merge * merge)


def row_grid(config: Any, grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """The (frames, height, width) its rows make, as the language model's positions see
    them."""
    merge = config.vision_config.spatial_merge_size
    return grid[0], grid[1] // merge, grid[2] // merge
