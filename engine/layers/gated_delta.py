"""The gated delta rule (Qwen3.5's and Qwen3-Next's linear attention) and the causal
convolution before it, in torch ops.

Each value head keeps a state S, a [key_dim, value_dim] matrix. Token t decays it by
exp(g_t), then writes its value under its key by the delta rule, with strength beta_t:

    S <- exp(g_t) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T q_t

A decode step applies that once per sequence, batched. A prompt's tokens go through it in
chunks: within a chunk the writes u_j = beta_j (v_j - (decayed S before j)^T k_j) depend on
each other through a unit lower-triangular system, solved at once, and the outputs and the
chunk's final state are then matrix products (the chunked form of Yang et al., "Gated Delta
Networks"). Both forms compute the same numbers up to rounding.

The states live in the runner's pool (layers/state_layer.py); sequences name their slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # prompt tokens solved together


def l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each row divided by its length (float32 in, float32 out), eps inside the root."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def conv_prompt(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One sequence's new rows x [L, channels] through the depthwise causal convolution
    (weight [channels, taps]) and SiLU, continuing from `state` [channels, taps - 1] (the
    inputs before them, zero for a new sequence), which is left holding the last inputs."""
    taps = weight.shape[-1]
    window = torch.cat([state.to(x.dtype), x.t()], dim=-1)
    out = F.conv1d(window.to(weight.dtype)[None], weight[:, None, :], groups=weight.shape[0])
    state.copy_(window[:, window.shape[-1] - (taps - 1):])
    return F.silu(out[0]).t().to(x.dtype)


def conv_step(x: torch.Tensor, states: torch.Tensor, slots: torch.Tensor,
              weight: torch.Tensor) -> torch.Tensor:
    """One new row per sequence, x [B, channels], through the convolution from each one's
    state (states [slots, channels, taps - 1], sequence i in slots[i]), updated in place."""
    window = torch.cat([states[slots].to(x.dtype), x[:, :, None]], dim=-1)
    states[slots] = window[..., 1:].to(states.dtype)
    return F.silu((window.to(weight.dtype) * weight).sum(-1)).to(x.dtype)


def delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, states: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One token per sequence (q, k [B, heads, key_dim], v [B, heads, value_dim], g and beta
    [B, heads], float32) through the rule from each one's state (states [slots, heads,
    key_dim, value_dim]), updated in place, in float32; returns o [B, heads, value_dim]."""
    state = states[slots].float() * g.exp()[..., None, None]
    remembered = torch.einsum("bhkv,bhk->bhv", state, k)
    write = (v - remembered) * beta[..., None]
    state = state + k[..., :, None] * write[..., None, :]
    states[slots] = state.to(states.dtype)
    return torch.einsum("bhkv,bhk->bhv", state, q)


def delta_prompt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One sequence's L tokens (q, k [L, heads, key_dim], v [L, heads, value_dim], g and
    beta [L, heads], float32) through the rule from `state` [heads, key_dim, value_dim]
    (updated in place), CHUNK tokens at a time, in float32; returns o [L, heads,
    value_dim]."""
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    g, beta = g.t(), beta.t()
    s = state.float()  # the pool may keep it in 16 bits
    outputs = []
    for start in range(0, q.shape[1], CHUNK):
        window = slice(start, start + CHUNK)
        o, s = _chunk(q[:, window], k[:, window], v[:, window], g[:, window],
                      beta[:, window], s)
        outputs.append(o)
    state.copy_(s)
    return torch.cat(outputs, dim=1).transpose(0, 1)


def _chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, per head: q, k [H, c, key_dim], v [H, c, value_dim], g, beta [H, c], s the
    state before it. With b the cumulative log decays, token j's write u_j solves
    u_j + beta_j sum_{m<j} e^(b_j - b_m) (k_j . k_m) u_m = beta_j (v_j - e^(b_j) s^T k_j);
    then o_i = e^(b_i) s^T q_i + sum_{j<=i} e^(b_i - b_j) (q_i . k_j) u_j, and the state
    after the chunk is e^(b_c) s + sum_j e^(b_c - b_j) k_j u_j^T."""
    size = q.shape[1]
    b = g.cumsum(-1)
    seen = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    decay = (b[:, :, None] - b[:, None, :]).masked_fill(~seen, float("-inf")).exp()
    earlier = (beta[:, :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = earlier + torch.eye(size, dtype=q.dtype, device=q.device)
    right = beta[..., None] * (v - b.exp()[..., None] * (k @ s))
    u = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
    o = b.exp()[..., None] * (q @ s) + ((q @ k.transpose(-1, -2)) * decay) @ u
    last = b[:, -1:]
    s = last.exp()[..., None] * s + (k * (last - b).exp()[..., None]).transpose(-1, -2) @ u
    return o, s


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """RMSNorm of each head's output (in float32, the weight applied in x's dtype), times
    SiLU of its gate, as transformers' Qwen3_5RMSNormGated."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(x.dtype)
    return (h * F.silu(gate.float())).to(x.dtype)
