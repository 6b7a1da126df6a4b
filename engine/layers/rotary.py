"""Rotary position embedding (half-rotation layout) on the whole head or its first part
(partial_rotary_factor), with linear, Llama-3, YaRN and LongRoPE frequency scaling, and Llama 4's
attention temperature (queries scaled by position, as Ministral 3 has it)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

LAYER_TYPES = ("full_attention", "sliding_attention")


def rope_parameters(config: Any, layer_type: str = "full_attention") -> dict:
    """The rope settings of a transformers config, old (rope_theta/rope_scaling) or new style.

    Gemma 3 keeps one set per kind of layer ({"full_attention": ..., "sliding_attention":
    ...}): `layer_type` picks one; a config with one set gives it for every kind."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if any(kind in params for kind in LAYER_TYPES):
        params = dict(params.get(layer_type) or params["full_attention"])
    scaling = getattr(config, "rope_scaling", None) or {}
    if not params:
        params = dict(scaling)
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    if (theta := layer_type_theta(config, layer_type)) is not None:
        params["rope_theta"] = theta
    if params["rope_type"] == "dynamic" and params.get("alpha"):
        # Hunyuan's NTK scaling by a fixed alpha: a larger base, the same at every length.
        dim = getattr(config, "head_dim", None) or \
            config.hidden_size // config.num_attention_heads
        params["rope_theta"] = params["rope_theta"] * params["alpha"] ** (dim / (dim - 2))
        params["rope_type"] = "default"
    if getattr(config, "partial_rotary_factor", None) is not None:
        params.setdefault("partial_rotary_factor", config.partial_rotary_factor)
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        # Phi-3 keeps its pretraining context beside the rope settings; it wins, as in
        # transformers.
        original = getattr(config, "original_max_position_embeddings", None)
        if params["rope_type"] == "longrope" and original:
            params["original_max_position_embeddings"] = original
        params.setdefault("original_max_position_embeddings",
                          getattr(config, "max_position_embeddings", None))
    if params["rope_type"] == "longrope" and params.get("factor") is None:
        params["factor"] = (config.max_position_embeddings
                            / params["original_max_position_embeddings"])
    return params


def layer_type_theta(config: Any, layer_type: str) -> float | None:
    """The rotary base of one kind of layer where the config gives one per layer (Granite
    SWA's layer_rope_theta, 0 for a layer without positional encoding); ValueError where
    layers of one kind rotate with different bases (one table a kind is kept)."""
    thetas = getattr(config, "layer_rope_theta", None)
    if thetas is None:
        return None
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * len(thetas)
    bases = {float(theta) for theta, kind in zip(thetas, kinds, strict=False)
             if theta and kind == layer_type}
    if len(bases) > 1:
        raise ValueError(f"layer_rope_theta gives the {layer_type} layers several rotary bases "
                         f"({sorted(bases)}); one base per kind of layer is supported")
    return bases.pop() if bases else None


ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


def rotary_dim(head_dim: int, params: dict) -> int:
    """How many of a head's leading dimensions rotate: all, or partial_rotary_factor of them
    (Phi-4-mini three quarters), rounded down as transformers does. Proportional rotary
    (Gemma 4) turns the whole head, its frequencies past the proportion zero."""
    if params["rope_type"] == "proportional":
        return head_dim
    return int(head_dim * float(params.get("partial_rotary_factor", 1.0)))


def check_rope(params: dict, head_dim: int) -> None:
    """ValueError naming what these rotary settings ask that is not computed here."""
    if params["rope_type"] not in ROPE_TYPES:
        raise ValueError(f"rope scaling type {params['rope_type']!r} is not supported "
                         f"({', '.join(ROPE_TYPES)})")
    dim = rotary_dim(head_dim, params)
    if dim <= 0 or dim % 2 or dim > head_dim:
        factor = params.get("partial_rotary_factor", 1.0)
        raise ValueError(f"partial_rotary_factor {factor} rotates {dim} of {head_dim} head "
                         "dimensions; it must be a positive even "
                         "number no larger than the head")
    if params["rope_type"] == "longrope":
        for name in ("short_factor", "long_factor"):
            if len(params.get(name) or ()) != dim // 2:
                raise ValueError(f"longrope {name} needs {dim // 2} numbers (one per rotary "
                                 f"frequency), got {len(params.get(name) or ())}")
    query_temperature(params)


def inverse_frequencies(head_dim: int, params: dict,
                        max_positions: int | None = None) -> torch.Tensor:
    """One frequency per pair of rotated dimensions. LongRoPE picks its factors by the
    longest sequence served (`max_positions`): the long ones past the original context, as
    transformers does for such a sequence and vLLM for such a --max-model-len."""
    check_rope(params, head_dim)
    dim = rotary_dim(head_dim, params)
    base = float(params["rope_theta"])
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (base ** exponents)
    kind = params["rope_type"]
    if kind == "default":
        return inv_freq
    if kind == "proportional":
        return _proportional(head_dim, params)
    if kind == "linear":
        return inv_freq / float(params["factor"])
    if kind == "llama3":
        return _llama3_scaled(inv_freq, params)
    if kind == "longrope":
        factors = params["long_factor" if _long(params, max_positions) else "short_factor"]
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base ** exponents)
    return _yarn_scaled(dim, params)


def _proportional(head_dim: int, params: dict) -> torch.Tensor:
    """Gemma 4's full-attention rotary: the first partial_rotary_factor of the frequencies
    are the usual ones over the whole head size, the rest zero (those pairs never turn)."""
    angles = int(float(params.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    base = float(params["rope_theta"])
    turned = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float()
                             / head_dim))
    return torch.cat([turned, torch.zeros(head_dim // 2 - angles)]) / float(
        params.get("factor", 1.0))


def _long(params: dict, max_positions: int | None) -> bool:
    """Whether LongRoPE takes its long factors: sequences may pass the original context."""
    return max_positions is not None and max_positions > params[
        "original_max_position_embeddings"]


def attention_scaling(params: dict, max_positions: int | None = None) -> float:
    """The factor on cos and sin (YaRN's and LongRoPE's "attention factor": it sharpens
    attention as the context stretches; PhiMoE's LongRoPE gives it as short_mscale and
    long_mscale, taken as its factors are); 1 for the other kinds."""
    if params["rope_type"] not in ("yarn", "longrope"):
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    if params["rope_type"] == "longrope" and params.get("short_mscale") is not None:
        return float(params["long_mscale" if _long(params, max_positions) else "short_mscale"])
    if params["rope_type"] == "longrope":
        factor = float(params["factor"])
        original = float(params["original_max_position_embeddings"])
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    factor = _yarn_factor(params)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def yarn_mscale(factor: float, weight: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `factor` times (1 if not stretched),
    weighted as DeepSeek's mscale and mscale_all_dim weigh it."""
    return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def _yarn_factor(params: dict) -> float:
    if params.get("factor") is None:
        raise ValueError("yarn rope scaling needs a factor")
    return float(params["factor"])


def _yarn_scaled(head_dim: int, params: dict) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): a rotary dimension that turns fewer than `beta_slow` times
    over the original context is interpolated (its frequency divided by `factor`), one that
    turns more than `beta_fast` times is kept, and the dimensions between blend linearly."""
    base = float(params["rope_theta"])
    factor = _yarn_factor(params)
    context = float(params["original_max_position_embeddings"])

    def dimension_turning(turns: float) -> float:
        """The (fractional) dimension index whose rotary turns `turns` times over the context."""
        return head_dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = dimension_turning(float(params.get("beta_fast") or 32))
    high = dimension_turning(float(params.get("beta_slow") or 1))
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # each dimension's weight of its own frequency (1: high, 0: low)
    wavelength_base = base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    kept = 1.0 / wavelength_base
    interpolated = 1.0 / (factor * wavelength_base)
    return interpolated * (1 - keep) + kept * keep


def _llama3_scaled(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def grid_axes(params: dict, frequencies: int) -> torch.Tensor | None:
    """Which of the (frame, row, column) positions turns each frequency, where the model
    gives image rows 3-D positions (M-RoPE: `mrope_section` frequencies for each axis, in
    turn, or Qwen3-VL's interleaved); None where positions are 1-D (or the sections do not
    cover the head: text alone never needs them)."""
    sections = params.get("mrope_section")
    if not sections or len(sections) != 3 or sum(sections) != frequencies:
        return None
    axes = [axis for axis, count in enumerate(sections) for _ in range(count)]
    if params.get("mrope_interleaved"):  # Qwen3-VL: frame, row, column, frame, row, ...
        axes = [0] * frequencies
        for axis in (1, 2):
            for frequency in range(axis, min(3 * sections[axis], frequencies), 3):
                axes[frequency] = axis
    return torch.tensor(axes, dtype=torch.long)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by absolute position (float32, as Hugging Face
    computes them before casting to the model dtype). Where the model gives image rows 3-D
    positions (M-RoPE), a step may bring them as [3, T]: each frequency then turns by the
    position along its axis."""

    def __init__(self, head_dim: int, max_positions: int, params: dict):
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, params, max_positions)
        axes = grid_axes(params, inv_freq.numel())
        self.register_buffer("axes", axes, persistent=False)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        scaling = attention_scaling(params, max_positions)
        cos = angles.cos() * scaling
        self.register_buffer("cos", torch.cat([cos, cos], dim=-1), persistent=False)
        # sin with rotate_half's sign folded in: rotate_half(x) * sin == roll(x) * signed_sin.
        # "backward": every angle negated (NanoChat's rotate_half is (x2, -x1)).
        sin = angles.sin() * scaling * (-1.0 if params.get("backward") else 1.0)
        self.register_buffer("signed_sin", torch.cat([-sin, sin], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                backend: str = "torch") -> RopeRows | RopeKernel:
        """The step's rotary inputs, built once and shared by every layer."""
        if positions.dim() == 2:
            return self._grid_rows(positions, dtype, backend)
        if backend == "triton":
            half = self.cos.shape[-1] // 2
            return RopeKernel(positions, self.cos[:, :half], self.signed_sin[:, half:])
        cos, sin = self.cos[positions], self.signed_sin[positions]
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return RopeRows(cos.unsqueeze(1), sin.unsqueeze(1))


    def _grid_rows(self, positions: torch.Tensor, dtype: torch.dtype,
                   backend: str) -> RopeRows | RopeKernel:
        """Rows of cos/sin where each frequency takes its axis's position ([3, T])."""
        if self.axes is None:
            raise ValueError("3-D positions for a model whose rotary settings have no "
                             "mrope_section")
        half = self.cos.shape[-1] // 2
        columns = torch.arange(half, device=positions.device)
        rows = positions.index_select(0, self.axes)  # [half, T]: each frequency's position
        cos = self.cos[rows, columns[:, None]].t()  # [T, half]
        sin = self.signed_sin[rows, columns[:, None] + half].t()
        if backend == "triton":
            steps = torch.arange(positions.shape[1], device=positions.device)
            return RopeKernel(steps, cos.contiguous(), sin.contiguous())
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return RopeRows(cos.unsqueeze(1), sin.unsqueeze(1))


class RopeRows(NamedTuple):
    """The torch path: this step's cos/sin rows in the model dtype."""

    cos: torch.Tensor  # [T, 1, dim]
    signed_sin: torch.Tensor

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, dim], k: [T, kv_heads, dim]; new tensors in the input dtype. Where
        the tables are narrower than a head, its leading dimensions rotate and the rest pass."""
        return self._rotate(q), self._rotate(k)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.cos.shape[-1]
        if dim == x.shape[-1]:
            return apply_rotary(x, self.cos, self.signed_sin)
        return torch.cat([apply_rotary(x[..., :dim], self.cos, self.signed_sin), x[..., dim:]],
                         dim=-1)


class RopeKernel(NamedTuple):
    """The Triton path: positions and the float32 tables, one column per frequency; the
    kernel looks the rows up and rotates q and k in place in one launch."""

    positions: torch.Tensor  # [T]
    cos: torch.Tensor  # [max_positions, dim / 2]
    sin: torch.Tensor

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dim = 2 * self.cos.shape[-1]
        if dim == q.shape[-1]:
            return _kernel()(q, k, self.positions, self.cos, self.sin)
        _kernel()(q[..., :dim], k[..., :dim], self.positions, self.cos, self.sin)
        return q, k


class ScaledQueries(NamedTuple):
    """Llama 4's attention temperature (`llama_4_scaling_beta` in the rope settings of
    Ministral 3): after rotating, each query is multiplied by 1 + beta * log(1 + floor(position
    / original_max_position_embeddings)), 1 within the pretraining context."""

    rope: RopeRows | RopeKernel
    scale: torch.Tensor  # [T, 1, 1] in the model dtype

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.rope.rotate(q, k)
        return q * self.scale, k


class QueryScale(NamedTuple):
    """Llama 4's attention temperature in its layers without positional encoding
    (attn_temperature_tuning): no turn, each query times its position's scale (float32, the
    product rounded to the model dtype as transformers does)."""

    scale: torch.Tensor  # [T, 1, 1] float32

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (q * self.scale).to(q.dtype), k


def nope_query_scale(positions: torch.Tensor, floor_scale: int,
                     attn_scale: float) -> QueryScale:
    """1 + attn_scale * log(1 + floor((position + 1) / floor_scale)) per row."""
    scale = torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
    return QueryScale(scale[:, None, None])


def query_temperature(params: dict) -> tuple[float, int] | None:
    """(beta, original_max_position_embeddings) of Llama 4's attention temperature where these
    rope settings ask for it, else None."""
    beta = params.get("llama_4_scaling_beta")
    if not beta:
        return None
    original = params.get("original_max_position_embeddings")
    if not original:
        raise ValueError("llama_4_scaling_beta needs original_max_position_embeddings in the "
                         "rope settings")
    return float(beta), int(original)


def scaled_queries(rope: RopeRows | RopeKernel, positions: torch.Tensor, dtype: torch.dtype,
                   temperature: tuple[float, int]) -> ScaledQueries:
    """The step's rotary inputs with Llama 4's query scale by position, computed in float32
    and rounded to the model dtype as transformers does."""
    beta, original = temperature
    scale = 1 + beta * torch.log(1 + torch.floor(positions / original))
    return ScaledQueries(rope, scale.to(dtype)[:, None, None])


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's x * cos + rotate_half(x) * sin in x's dtype, bit for bit, in 4 ops
    instead of 7: rotate_half(x) = cat(-x2, x1) equals roll(x) = cat(x2, x1) with the sign
    moved onto sin (exact: negation commutes with rounding)."""
    half = x.shape[-1] // 2
    return (x * cos).add_(x.roll(half, -1).mul_(signed_sin))


@functools.cache
def _kernel() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    from tokenmill.engine.kernels.rotary import rotary

    return rotary
