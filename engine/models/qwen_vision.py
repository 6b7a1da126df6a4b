"""Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's image encoder: the processor cuts an image, at its
own size, into patches of 2 frames x 14 x 14 pixels (Qwen3-VL: 16 x 16; a still image repeats
its frame), ordered so that each 2 x 2 block of neighbours is consecutive; a vision
transformer with a 2-D rotary embedding reads them, and a merger folds each block into one
row of the language model's width. Qwen2-VL's blocks are LayerNorm and a two-layer MLP, each
attending over the whole image; Qwen2.5-VL's are RMSNorm and a gated MLP, most attending only
within windows of the image (the others over all of it); Qwen3-VL's are Qwen2-VL's over
patches that also take a learned position embedding resampled to the image's grid, and
mergers after some middle blocks give rows that the language model adds to its first layers'
outputs (DeepStack). Modules carry the checkpoints' names (`visual.blocks.N.attn.qkv`,
`visual.merger.mlp.0`, ...)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.vision_encoder import RMSNorm, activation

QWEN2_VL = ("qwen2_vl_vision", "qwen2_vl")
QWEN2_5_VL = ("qwen2_5_vl_vision", "qwen2_5_vl")
QWEN3_VL = ("qwen3_vl_vision", "qwen3_vl", "qwen3_vl_moe_vision", "qwen3_vl_moe")
# Qwen3.5's tower is Qwen3-VL's without DeepStack.
QWEN3_5 = ("qwen3_5_vision", "qwen3_5_moe_vision")
EPS = 1e-6


def _norm(dim: int, rms: bool) -> nn.Module:
    return RMSNorm(dim, EPS) if rms else nn.LayerNorm(dim, eps=EPS)


class PatchEmbed(nn.Module):
    """A patch's pixels (channels x frames x height x width, flattened) to its features."""

    def __init__(self, config: Any, dim: int, bias: bool):
        super().__init__()
        size = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, dim, kernel_size=size, stride=size,
                              bias=bias)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # The kernel covers the whole patch: the convolution is one matrix product.
        return F.linear(patches.to(self.proj.weight.dtype), self.proj.weight.flatten(1),
                        self.proj.bias)


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
    """fc1, activation, fc2 (Qwen3-VL names them linear_fc1 and linear_fc2)."""

    def __init__(self, dim: int, hidden: int, act: str, names: tuple[str, str]):
        super().__init__()
        self.names = names
        setattr(self, names[0], nn.Linear(dim, hidden))
        setattr(self, names[1], nn.Linear(hidden, dim))
        self.act = activation(act, "vision_config.hidden_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = (getattr(self, name) for name in self.names)
        return second(self.act(first(x)))


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
    def __init__(self, config: Any, dim: int, kind: str):
        super().__init__()
        gated = kind == "qwen2_5"
        self.norm1, self.norm2 = _norm(dim, gated), _norm(dim, gated)
        self.attn = Attention(dim, config.num_heads)
        if gated:
            self.mlp = GatedMLP(dim, config.intermediate_size, config.hidden_act)
        elif kind == "qwen3":
            self.mlp = MLP(dim, config.intermediate_size, config.hidden_act,
                           ("linear_fc1", "linear_fc2"))
        else:
            self.mlp = MLP(dim, int(dim * config.mlp_ratio), config.hidden_act, ("fc1", "fc2"))

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


class Qwen3Merger(nn.Module):
    """Qwen3-VL's merger: the norm over each patch (or, for a DeepStack merger, over the
    block's concatenation), then two layers."""

    def __init__(self, dim: int, out: int, merge: int, after_concat: bool):
        super().__init__()
        self.width = dim * merge * merge
        self.after_concat = after_concat
        self.norm = nn.LayerNorm(self.width if after_concat else dim, eps=EPS)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width)) if self.after_concat else \
            self.norm(x).view(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


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


def resampled_positions(grid: tuple[int, int, int], merge: int,
                        side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL's learned position table (side x side) resampled bilinearly, corners aligned,
    to an image's patch grid: each patch's four table rows and their weights, in the
    processor's patch order."""
    _, height, width = grid
    rows, cols = patch_positions(grid, merge)

    def taps(index: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        source = index.float() * (side - 1) / max(size - 1, 1)
        low = source.floor()
        frac = source - low
        low = low.long()
        return torch.stack([low, (low + 1).clamp(max=side - 1)], -1), \
            torch.stack([1 - frac, frac], -1)

    row_taps, row_weights = taps(rows, height)
    col_taps, col_weights = taps(cols, width)
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).flatten(1)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).flatten(1)
    return indices, weights


class QwenVisionTower(nn.Module):
    def __init__(self, config: Any, out: int, kind: str):
        super().__init__()
        dim = config.embed_dim if kind == "qwen2" else config.hidden_size
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, dim, bias=kind == "qwen3")
        self.blocks = nn.ModuleList(Block(config, dim, kind) for _ in range(config.depth))
        self.pos_embed = None
        self.deepstack: list[int] = []
        if kind == "qwen3":
            self.pos_embed = nn.Embedding(config.num_position_embeddings, dim)
            self.side = int(config.num_position_embeddings ** 0.5)
            self.merger = Qwen3Merger(dim, out, self.merge, after_concat=False)
            self.deepstack = list(getattr(config, "deepstack_visual_indexes", None) or [])
            self.deepstack_merger_list = nn.ModuleList(
                Qwen3Merger(dim, out, self.merge, after_concat=True) for _ in self.deepstack)
        else:
            self.merger = Merger(dim, out, self.merge, rms=kind == "qwen2_5")
        gated = kind == "qwen2_5"
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
        (frames, height, width) -> its rows [n / merge^2, out] (Qwen3-VL: out times one plus
        the number of DeepStack mergers, their rows after the merger's)."""
        cos, sin = self.rotary(grid, patches.device)
        x = self.patch_embed(patches)
        if self.pos_embed is not None:
            indices, weights = resampled_positions(grid, self.merge, self.side)
            table = self.pos_embed(indices.to(x.device))
            x = x + (table * weights.to(x.device)[:, :, None]).sum(1).to(x.dtype)
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
        deep = []
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, whole if index in self.full_blocks else by_window)
            if index in self.deepstack:
                deep.append(self.deepstack_merger_list[self.deepstack.index(index)](x))
        merged = self.merger(x)
        if order is not None:  # back in the image's order
            merged = merged[torch.argsort(order)]
        return torch.cat([merged, *deep], dim=-1) if deep else merged


class QwenImageEncoder(nn.Module):
    """(one image's patches, its patch grid) -> its rows, for Qwen2-VL, Qwen2.5-VL and
    Qwen3-VL."""

    def __init__(self, config: Any):
        super().__init__()
        vision = config.vision_config
        kind = "qwen2_5" if vision.model_type in QWEN2_5_VL else \
            "qwen3" if vision.model_type in QWEN3_VL + QWEN3_5 else "qwen2"
        out = vision.hidden_size if kind == "qwen2" else vision.out_hidden_size
        self.visual = QwenVisionTower(vision, out, kind)

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
