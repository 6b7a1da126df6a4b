"""Mamba's (Mamba-1's) selective scan, in torch ops.

Each channel keeps `state_size` states, each decaying at its own rate A (negative) scaled by
the channel's dt; token t writes its input x_t (times dt_t) under B_t and reads with C_t:

    h <- exp(dt_t A) * h + dt_t x_t B_t;   y_t = h C_t + D x_t

A prompt chunk runs token by token (the decay differs per channel and state, so the chunked
form of Mamba-2's scan, one decay per head, does not apply); the step's chunks run together,
in one Triton launch on the triton backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


@functools.cache
def _kernel() -> Callable[..., torch.Tensor]:
    from tokenmill.engine.kernels.selective_scan import selective_scan

    return selective_scan


def _advance(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor,
             b: torch.Tensor) -> torch.Tensor:
    """state [B, C, N] after one token: x, dt [B, C], b [B, N]."""
    return state * (dt[..., None] * a).exp() + (dt * x.float())[..., None] * b.float()[:, None]


def _read(state: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (state @ c.float()[..., None]).squeeze(-1)


def selective_step(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   c: torch.Tensor, d: torch.Tensor, states: torch.Tensor,
                   slots: torch.Tensor) -> torch.Tensor:
    """One token per sequence: x [B, C], dt [B, C] (float32), a = A [C, N], b and c [B, N],
    d [C]; states [slots, C, N], updated in place. Returns y [B, C] in float32."""
    state = _advance(states[slots].float(), x, dt, a, b)
    states[slots] = state.to(states.dtype)
    return _read(state, c) + d.float() * x.float()


def selective_prompts(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      c: torch.Tensor, d: torch.Tensor, states: torch.Tensor,
                      slots: torch.Tensor, lengths: torch.Tensor,
                      backend: str = "torch") -> torch.Tensor:
    """Prompt chunks of B sequences padded to the longest: x and dt [B, L, C] (dt float32, 0
    in padding: it neither decays nor writes), b and c [B, L, N], each chunk's length;
    returns y [B, L, C] in float32. The triton backend scans in one launch
    (kernels/selective_scan.py)."""
    if backend == "triton":
        return _kernel()(x, dt, a, b, c, d, states, slots, lengths)
    state = states[slots].float()
    ys = []
    for t in range(x.shape[1]):
        state = _advance(state, x[:, t], dt[:, t], a, b[:, t])
        ys.append(_read(state, c[:, t]))
    states[slots] = state.to(states.dtype)
    return torch.stack(ys, dim=1) + d.float() * x.float()
