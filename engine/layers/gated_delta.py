"""The gated delta rule (Qwen3.5's and Qwen3-Next's linear attention) and the causal
convolution before it, in torch ops.

Each value head keeps a state S, a [key_dim, value_dim] matrix. Token t decays it by
exp(g_t), then writes its value under its key by the delta rule, with strength beta_t:

    S <- exp(g_t) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T q_t

A decode step applies that once per sequence, batched. Prompt chunks go through it padded
to the longest and batched too, CHUNK tokens at a time: within a chunk the writes
u_j = beta_j (v_j - (decayed S before j)^T k_j) depend on each other through a unit
lower-triangular system, solved at once, and the outputs and the chunk's final state are
then matrix products (the chunked form of Yang et al., "Gated Delta
Networks"). Both forms compute the same numbers up to rounding.

The states live in the runner's pool (layers/state_layer.py); sequences name their slots.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

CHUNK = 64  # prompt tokens solved together
# The same where each key channel decays on its own: a chunk's decays are [c, c, key_dim].
CHANNEL_CHUNK = 32


def l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each row divided by its length (float32 in, float32 out), eps inside the root."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def conv_prompts(x: torch.Tensor, lengths: torch.Tensor, states: torch.Tensor,
                 slots: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """Prompt chunks of B sequences, x [B, L, channels] right-padded (sequence i's first
    lengths[i] rows hold its new rows), through the depthwise causal convolution (weight
    [channels, taps]) and SiLU (none where not `silu`: LFM2's), each from its state (states
    [slots, channels, taps - 1]: the inputs before its chunk, zero for a new sequence); each
    state is left holding its sequence's last inputs. Returns [B, L, channels]; padding rows
    hold no meaning."""
    taps = weight.shape[-1]
    window = torch.cat([states[slots].to(x.dtype), x.transpose(1, 2)], dim=-1)
    out = F.conv1d(window.to(weight.dtype), weight[:, None, :], bias, groups=weight.shape[0])
    # Sequence i's last taps - 1 inputs end where its rows do: columns len_i .. len_i + taps - 2.
    last = lengths[:, None] + torch.arange(taps - 1, device=x.device)
    states[slots] = window.gather(2, last[:, None, :].expand(-1, window.shape[1], -1)) \
        .to(states.dtype)
    return (F.silu(out) if silu else out).transpose(1, 2).to(x.dtype)


def conv_step(x: torch.Tensor, states: torch.Tensor, slots: torch.Tensor,
              weight: torch.Tensor, bias: torch.Tensor | None = None,
              silu: bool = True) -> torch.Tensor:
    """One new row per sequence, x [B, channels], through the convolution (with Mamba-2's
    `bias`; SiLU where `silu`) from each one's state (states [slots, channels, taps - 1],
    sequence i in slots[i]), updated in place."""
    window = torch.cat([states[slots].to(x.dtype), x[:, :, None]], dim=-1)
    states[slots] = window[..., 1:].to(states.dtype)
    out = (window.to(weight.dtype) * weight).sum(-1)
    out = out if bias is None else out + bias
    return (F.silu(out) if silu else out).to(x.dtype)


def delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, states: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One token per sequence (q, k [B, heads, key_dim], v [B, heads, value_dim], g and beta
    [B, heads], float32; g [B, heads, key_dim] where each key channel decays on its own, as
    Kimi's) through the rule from each one's state (states [slots, heads, key_dim,
    value_dim]), updated in place, in float32; returns o [B, heads, value_dim]."""
    decay = g.exp()[..., None] if g.dim() == 3 else g.exp()[..., None, None]
    state = states[slots].float() * decay
    remembered = torch.einsum("bhkv,bhk->bhv", state, k)
    write = (v - remembered) * beta[..., None]
    state = state + k[..., :, None] * write[..., None, :]
    states[slots] = state.to(states.dtype)
    return torch.einsum("bhkv,bhk->bhv", state, q)


def delta_prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, states: torch.Tensor,
                  slots: torch.Tensor) -> torch.Tensor:
    """Prompt chunks of B sequences (q, k [B, L, heads, key_dim], v [B, L, heads, value_dim],
    g and beta [B, L, heads], float32, right-padded with g and beta 0 so that padding neither
    decays nor writes) through the rule from each one's state (states [slots, heads,
    key_dim, value_dim], updated in place), CHUNK tokens at a time for all of them together,
    in float32; returns o [B, L, heads, value_dim].

    Within a chunk, with b the cumulative log decays, token j's write u_j solves
    u_j + beta_j sum_{m<j} e^(b_j - b_m) (k_j . k_m) u_m = beta_j (v_j - e^(b_j) s^T k_j)."""
    v, beta = v.transpose(1, 2), beta.transpose(1, 2)

    def writes(window: slice, k: torch.Tensor, b: torch.Tensor, decay: torch.Tensor,
               s: torch.Tensor) -> torch.Tensor:
        strength = beta[:, :, window]
        earlier = (strength[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
        system = earlier + torch.eye(k.shape[-2], dtype=k.dtype, device=k.device)
        right = strength[..., None] * (v[:, :, window] - b.exp()[..., None] * (k @ s))
        return torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)

    return decayed_scan(q, k, g, states, slots, writes)


def channel_delta_prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, states: torch.Tensor,
                          slots: torch.Tensor) -> torch.Tensor:
    """delta_prompts where each key channel decays on its own (Kimi Delta Attention: g [B, L,
    heads, key_dim], 0 for padding), CHANNEL_CHUNK tokens at a time. With b the cumulative
    log decays (a vector per token) and D_ij = e^(b_i - b_j) per channel (j <= i), token j's
    write solves u_j + beta_j sum_{m<j} (k_j . D_jm k_m) u_m = beta_j (v_j - s^T (e^(b_j) k_j)),
    o_i = s^T (e^(b_i) q_i) + sum_{j<=i} (q_i . D_ij k_j) u_j, and the state after the chunk
    is e^(b_c) s + sum_j (e^(b_c - b_j) k_j) u_j^T: the per-channel factors are kept whole,
    never split into e^(b_i) and e^(-b_j), which would overflow over a long chunk."""
    q, k, v, g = (x.transpose(1, 2) for x in (q, k, v, g))
    beta = beta.transpose(1, 2)
    s = states[slots].float()
    outputs = []
    for start in range(0, q.shape[2], CHANNEL_CHUNK):
        window = slice(start, start + CHANNEL_CHUNK)
        qc, kc, vc, strength = q[:, :, window], k[:, :, window], v[:, :, window], \
            beta[:, :, window]
        b = g[:, :, window].cumsum(2)  # [B, heads, c, key_dim]
        size = b.shape[2]
        seen = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        pairs = (b[:, :, :, None] - b[:, :, None]).masked_fill(~seen[..., None], float("-inf"))
        decayed_k = pairs.exp() * kc[:, :, None]  # [B, heads, i, j, key_dim]: D_ij k_j
        earlier = torch.einsum("bhjd,bhjmd->bhjm", kc, decayed_k).tril(-1)
        system = strength[..., None] * earlier + torch.eye(size, dtype=q.dtype, device=q.device)
        right = strength[..., None] * (vc - (kc * b.exp()) @ s)
        u = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
        scores = torch.einsum("bhid,bhijd->bhij", qc, decayed_k)
        outputs.append((qc * b.exp()) @ s + scores @ u)
        last = b[:, :, -1:]
        s = last.transpose(-1, -2).exp() * s + (kc * (last - b).exp()).transpose(-1, -2) @ u
    states[slots] = s.to(states.dtype)
    return torch.cat(outputs, dim=2).transpose(1, 2)


Writes = Callable[[slice, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                  torch.Tensor]


def decayed_scan(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, states: torch.Tensor,
                 slots: torch.Tensor, writes: Writes) -> torch.Tensor:
    """A decayed linear recurrence S <- e^(g_t) S + k_t u_t^T, o_t = S^T q_t over padded
    prompt chunks (q, k [B, L, heads, key_dim], g [B, L, heads] float32), from each
    sequence's state in `states` (updated in place), CHUNK tokens at a time. `writes(window,
    k, b, decay, s)` gives the chunk's writes u [B, heads, c, value_dim] from its keys, its
    cumulative log decays b, the decay matrix (e^(b_i - b_j) for j <= i, else 0) and the
    state before it (the delta rule solves for them; Mamba-2's are given). Then
    o_i = e^(b_i) s^T q_i + sum_{j<=i} e^(b_i - b_j) (q_i . k_j) u_j, and the state after
    the chunk is e^(b_c) s + sum_j e^(b_c - b_j) k_j u_j^T."""
    q, k, g = q.transpose(1, 2), k.transpose(1, 2), g.transpose(1, 2)
    s = states[slots].float()
    outputs = []
    for start in range(0, q.shape[2], CHUNK):
        window = slice(start, start + CHUNK)
        qc, kc = q[:, :, window], k[:, :, window]
        b = g[:, :, window].cumsum(-1)
        size = b.shape[-1]
        seen = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        decay = (b[..., :, None] - b[..., None, :]).masked_fill(~seen, float("-inf")).exp()
        u = writes(window, kc, b, decay, s)
        outputs.append(b.exp()[..., None] * (qc @ s) + ((qc @ kc.transpose(-1, -2)) * decay) @ u)
        last = b[..., -1:]
        s = last.exp()[..., None] * s + (kc * (last - b).exp()[..., None]).transpose(-1, -2) @ u
    states[slots] = s.to(states.dtype)
    return torch.cat(outputs, dim=2).transpose(1, 2)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """RMSNorm of each head's output (in float32, the weight applied in x's dtype), times
    SiLU of its gate, as transformers' Qwen3_5RMSNormGated."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(x.dtype)
    return (h * F.silu(gate.float())).to(x.dtype)


def sigmoid_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> torch.Tensor:
    """RMSNorm of each head's output and its weight in float32, times the sigmoid of its
    gate, as transformers' KimiLinearRMSNormGated (Kimi Delta Attention's output norm)."""
    h = x.float()
    h = weight.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
    return (h * torch.sigmoid(gate.float())).to(x.dtype)
