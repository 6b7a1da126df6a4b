"""Mamba-2's selective state space scan (Granite 4.0-H's recurrent layers), in torch ops.

Each head keeps a state S, a [state_size, head_dim] matrix. Token t decays it by
exp(dt_t A), writes its input x_t (times dt_t) under its group's B_t, and reads it with C_t:

    S <- exp(dt_t A) S + B_t (dt_t x_t)^T;   y_t = S^T C_t + D x_t

the decayed recurrence of the gated delta rule without its correction (layers/gated_delta.py
computes prompt chunks of both). dt is softplus(dt + dt_bias), clamped to the config's
time_step_limit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tokenmill.engine.layers.gated_delta import decayed_scan


def heads_of(groups: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., groups, state_size] -> [..., heads, state_size]: each group's B or C for each
    of its consecutive heads, in float32."""
    return groups.float().repeat_interleave(heads // groups.shape[-2], dim=-2)


def ssm_step(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             c: torch.Tensor, d: torch.Tensor, states: torch.Tensor,
             slots: torch.Tensor) -> torch.Tensor:
    """One token per sequence: x [B, heads, head_dim], dt [B, heads] (float32), a = A
    [heads] (negative), b and c [B, groups, state_size], d [heads]; states [slots, heads,
    state_size, head_dim], updated in place. Returns y [B, heads, head_dim] in float32."""
    heads = x.shape[1]
    state = states[slots].float() * (dt * a).exp()[..., None, None]
    state = state + heads_of(b, heads)[..., :, None] * (dt[..., None] * x.float())[..., None, :]
    states[slots] = state.to(states.dtype)
    return torch.einsum("bhnp,bhn->bhp", state, heads_of(c, heads)) + \
        d.float()[:, None] * x.float()


def ssm_prompts(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                c: torch.Tensor, d: torch.Tensor, states: torch.Tensor,
                slots: torch.Tensor) -> torch.Tensor:
    """Prompt chunks of B sequences padded to the longest: x [B, L, heads, head_dim], dt
    [B, L, heads] (float32, 0 in padding: it neither decays nor writes), b and c [B, L,
    groups, state_size]; returns y [B, L, heads, head_dim] in float32."""
    heads = x.shape[2]
    writes = (dt[..., None] * x.float()).transpose(1, 2)

    def given(window: slice, *_: torch.Tensor) -> torch.Tensor:
        return writes[:, :, window]

    y = decayed_scan(heads_of(c, heads), heads_of(b, heads), dt * a, states, slots, given)
    return y + d.float()[:, None] * x.float()


def grouped_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                           groups: int, eps: float,
                           mean_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
                           gate_first: bool = True) -> torch.Tensor:
    """x times SiLU of its gate, then RMSNorm over each of `groups` equal parts (in float32),
    the weight applied in x's dtype: transformers' GraniteMoeHybridRMSNormGated. Where a
    part is a piece of a group other ranks hold the rest of, `mean_of` turns the part's sum
    of squares ([..., groups, 1]) into the group's mean square. Not `gate_first` (Falcon-H1's
    mamba_norm_before_gate): x normalized first, then gated."""
    h = x.float() * F.silu(gate.float()) if gate_first else x.float()
    parts = h.view(*h.shape[:-1], groups, -1)
    squares = parts.pow(2)
    mean = squares.mean(-1, keepdim=True) if mean_of is None else \
        mean_of(squares.sum(-1, keepdim=True))
    parts = parts * torch.rsqrt(mean + eps)
    normed = weight * parts.view(h.shape).to(x.dtype)
    return normed if gate_first else (normed * F.silu(gate.float())).to(x.dtype)
