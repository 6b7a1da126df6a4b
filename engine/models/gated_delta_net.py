"""Qwen3.5's and Qwen3-Next's linear-attention layer (transformers' GatedDeltaNet): the
token mixer of three layers in four, which keeps a fixed-size state per sequence instead of
keys and values (layers/gated_delta.py has the rule and its convolution).

The input is projected to queries, keys and values (one causal convolution over all three),
an output gate z, and per value head a write strength beta (sigmoid of b) and a decay g
(-exp(A_log) * softplus(a + dt_bias)). Queries and keys are L2-normalized per head, the
queries scaled by key_dim ** -0.5; each value head's output is normalized and gated by
SiLU(z) before the output projection. Decoding sequences are computed together, and so are
the step's prompt chunks (padded to the longest), every one from its slot of the state
pool."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.contract.model_shape import linear_attention_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.gated_delta import (
    channel_delta_prompts,
    conv_prompts,
    conv_step,
    delta_prompts,
    delta_step,
    gated_rms_norm,
    l2_normalized,
    sigmoid_gated_rms_norm,
)
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.layers.to_device import list_to_device


@dataclass(frozen=True)
class PromptRuns:
    """The step's longer runs (prompt chunks), padded to the longest: each run's rows as a
    [runs, longest] index into the step's rows (padding repeats its last row), which of them
    are its own, their flat rows in run order, each run's length and slot."""

    index: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
    lengths: torch.Tensor
    slots: torch.Tensor

    @classmethod
    def build(cls, starts: list[int], lengths: list[int], slots: list[int],
              device: torch.device) -> PromptRuns:
        """From each run's first row, length and slot (one host copy each); the rest is
        derived on the device."""
        first, count = (list_to_device(v, torch.long, device) for v in (starts, lengths))
        offsets = torch.arange(max(lengths), device=device)
        index = first[:, None] + torch.minimum(offsets[None, :], count[:, None] - 1)
        mask = offsets[None, :] < count[:, None]
        return cls(index, mask, index[mask], count, list_to_device(slots, torch.long, device))

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, ...] as [runs, longest, ...]."""
        return x[self.index]


Step = Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SequenceRuns:
    """A step's rows as the state-keeping layers take them: the decoding sequences' rows
    (None: every row, one per sequence, in order) and slots, and the prompt chunks (None:
    none)."""

    decode_rows: torch.Tensor | None
    decode_slots: torch.Tensor | None
    prompts: PromptRuns | None

    @property
    def decodes_only(self) -> bool:
        return self.decode_rows is None and self.prompts is None

    def mix(self, step: Step, prompts: Callable[[PromptRuns], torch.Tensor],
            out: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The step's rows through a state-keeping op: `step(rows, slots)` for the decoding
        sequences together (rows None: every row), `prompts(runs)` for the prompt chunks
        together (padded: [runs, longest, ...]), scattered into `out()`'s rows."""
        if self.decodes_only:
            return step(None, self.decode_slots)
        result = out()
        if self.decode_rows is not None:
            result[self.decode_rows] = step(self.decode_rows, self.decode_slots)
        if self.prompts is not None:
            result[self.prompts.rows] = prompts(self.prompts)[self.prompts.mask]
        return result


def sequence_runs(meta: AttentionMetadata) -> SequenceRuns:
    """The step's runs, built once per step (every such layer reads the same)."""
    runs = meta.step_cache.get("sequence_runs")
    if runs is None:
        runs = meta.step_cache["sequence_runs"] = _runs(meta)
    return runs


def _runs(meta: AttentionMetadata) -> SequenceRuns:
    lengths, slots = meta.query_lens_list, meta.state_slots_list
    if all(n == 1 for n in lengths):
        return SequenceRuns(None, meta.state_slots, None)
    starts = list(accumulate(lengths, initial=0))
    decodes = [i for i, n in enumerate(lengths) if n == 1]
    device = meta.query_start_loc.device
    rows = list_to_device([starts[i] for i in decodes], torch.long, device) if decodes \
        else None
    decode_slots = list_to_device([slots[i] for i in decodes], torch.long, device) \
        if decodes else None
    longer = [i for i, n in enumerate(lengths) if n > 1]
    prompts = PromptRuns.build([starts[i] for i in longer], [lengths[i] for i in longer],
                               [slots[i] for i in longer], device)
    return SequenceRuns(rows, decode_slots, prompts)


def convolve(x: torch.Tensor, states: StateLayer, runs: SequenceRuns, weight: torch.Tensor,
             bias: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """The step's rows [T, channels] through the causal convolution (weight [channels,
    taps], Mamba-2's bias) and SiLU (none where not `silu`), each sequence from its state:
    the decoding ones together, the prompt chunks together."""
    return runs.mix(
        lambda rows, slots: conv_step(x if rows is None else x[rows], states.conv, slots,
                                      weight, bias, silu),
        lambda p: conv_prompts(p.padded(x), p.lengths, states.conv, p.slots, weight, bias,
                               silu),
        lambda: torch.empty_like(x))


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, ssm: torch.Tensor, runs: SequenceRuns) -> torch.Tensor:
    """The step's rows through the gated delta rule (float32; g [T, heads], or [T, heads,
    key_dim] where each key channel decays on its own, Kimi's), each sequence from its state
    in `ssm`: the decoding ones together, the prompt chunks together."""
    prompt_rule = channel_delta_prompts if g.dim() == 3 else delta_prompts

    def step(rows: torch.Tensor | None, slots: torch.Tensor) -> torch.Tensor:
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if rows is None else t[rows]

        return delta_step(pick(q), pick(k), pick(v), pick(g), pick(beta), ssm, slots)

    def prompts(p: PromptRuns) -> torch.Tensor:  # padding neither decays nor writes
        own = p.mask[..., None]
        decay_own = own[..., None] if g.dim() == 3 else own
        return prompt_rule(p.padded(q), p.padded(k), p.padded(v), p.padded(g) * decay_own,
                           p.padded(beta) * own, ssm, p.slots)

    return runs.mix(step, prompts, lambda: torch.empty_like(v))


class GatedNorm(nn.Module):
    """Each value head's RMSNorm (weight over value_dim), times SiLU of its gate (Kimi's:
    the sigmoid, `sigmoid`)."""

    def __init__(self, size: int, eps: float, sigmoid: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.norm = sigmoid_gated_rms_norm if sigmoid else gated_rms_norm

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.norm(x, gate, self.weight, self.eps)


class GatedDeltaNet(nn.Module):
    """Parameters under transformers' Qwen3.5 names (in_proj_qkv, in_proj_z, in_proj_b and
    in_proj_a merged into one matmul; Qwen3-Next's fused in_proj_qkvz and in_proj_ba are
    reordered into them at load, models/fused_weights.py; OLMo Hybrid's q_proj, k_proj,
    v_proj, g_proj, b_proj and a_proj are the same rows in that order, its convolution
    three, its out_proj o_proj, its norm o_norm)."""

    def __init__(self, config: Any, tp: TPGroup):
        """This rank's key heads and the value heads they serve; out_proj's partial sums are
        added across ranks."""
        super().__init__()
        shape = linear_attention_of(config).sharded(tp.size)
        self.shape, self.tp = shape, tp
        keys = shape.num_k_heads * shape.key_dim
        values = shape.num_v_heads * shape.value_dim
        heads = shape.num_v_heads
        olmo = config.model_type == "olmo_hybrid"
        parts = {"q_proj": keys, "k_proj": keys, "v_proj": values, "g_proj": values,
                 "b_proj": heads, "a_proj": heads} if olmo else {
            "in_proj_qkv": 2 * keys + values, "in_proj_z": values, "in_proj_b": heads,
            "in_proj_a": heads}
        self.in_proj = MergedLinear(config.hidden_size, parts, bias=False)
        self.widths = [2 * keys + values, values, heads, heads]  # q, k and v together
        # OLMo Hybrid convolves q, k and v each with its own weights (q_conv1d, k_conv1d,
        # v_conv1d), the same depthwise convolution as one over them side by side.
        self.convs = ("q_conv1d", "k_conv1d", "v_conv1d") if olmo else ("conv1d",)
        sizes = (keys, keys, values) if olmo else (shape.conv_channels,)
        for name, channels in zip(self.convs, sizes, strict=True):
            setattr(self, name, nn.Conv1d(channels, channels, shape.conv_kernel,
                                          groups=channels, bias=False))
        self.dt_bias = nn.Parameter(torch.ones(heads))
        self.A_log = nn.Parameter(torch.zeros(heads))
        # OLMo Hybrid's norm has its own epsilon, and its write strengths reach 2
        # (linear_allow_neg_eigval: the update may flip a direction of the state).
        self.norm_name, self.out_name = ("o_norm", "o_proj") if olmo else ("norm", "out_proj")
        setattr(self, self.norm_name,
                GatedNorm(shape.value_dim, 1e-5 if olmo else config.rms_norm_eps))
        setattr(self, self.out_name, nn.Linear(values, config.hidden_size, bias=False))
        self.beta_scale = 2.0 if olmo and getattr(config, "linear_allow_neg_eigval", False) \
            else 1.0

    def forward(self, x: torch.Tensor, states: StateLayer,
                meta: AttentionMetadata) -> torch.Tensor:
        shape, tokens = self.shape, x.shape[0]
        qkv, z, b, a = self.in_proj.forward_merged(x).split(self.widths, dim=-1)
        runs = sequence_runs(meta)
        weight = torch.cat([getattr(self, name).weight for name in self.convs]) \
            if len(self.convs) > 1 else self.conv1d.weight
        mixed = convolve(qkv, states, runs, weight[:, 0])
        keys = shape.num_k_heads * shape.key_dim
        q, k, v = mixed.split([keys, keys, shape.num_v_heads * shape.value_dim], dim=-1)
        q = l2_normalized(q.reshape(tokens, shape.num_k_heads, shape.key_dim).float())
        k = l2_normalized(k.reshape(tokens, shape.num_k_heads, shape.key_dim).float())
        q = q * shape.key_dim ** -0.5
        repeats = shape.num_v_heads // shape.num_k_heads
        if repeats > 1:  # each key head serves that many consecutive value heads
            q, k = q.repeat_interleave(repeats, dim=1), k.repeat_interleave(repeats, dim=1)
        v = v.reshape(tokens, shape.num_v_heads, shape.value_dim).float()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        beta = b.sigmoid().float()
        if self.beta_scale != 1.0:
            beta = beta * self.beta_scale
        o = delta_rule(q, k, v, g, beta, states.ssm, runs).to(x.dtype)
        o = getattr(self, self.norm_name)(o, z.reshape(tokens, shape.num_v_heads,
                                                       shape.value_dim))
        return self.tp.all_reduce(getattr(self, self.out_name)(o.reshape(tokens, -1)))
