"""Mamba-1's selective scan over prompt chunks in one launch: one program per sequence and
block of channels keeps that block's [channels, state_size] state in registers and walks the
chunk's tokens, where the torch reference (`layers/mamba1.selective_prompts`) launches a
handful of kernels per token.

Each token decays the state by exp(dt A), writes dt x B and reads y = h C + D x (float32
throughout); a sequence's tokens past its own length are not computed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _selective_scan_kernel(
    x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, state_ptr, slots_ptr, lengths_ptr, y_ptr,
    stride_x0, stride_x1, stride_b0, stride_b1, stride_s0, stride_s1,
    channels, states,
    BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ns = tl.arange(0, BLOCK_N)
    col_mask, n_mask = cols < channels, ns < states
    both = col_mask[:, None] & n_mask[None, :]
    slot = tl.load(slots_ptr + seq)
    length = tl.load(lengths_ptr + seq)
    state_at = state_ptr + slot * stride_s0 + cols[:, None] * stride_s1 + ns[None, :]
    h = tl.load(state_at, mask=both, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + cols[:, None] * states + ns[None, :], mask=both, other=0.0)
    d = tl.load(d_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    for t in range(0, length):
        row = seq * stride_x0 + t * stride_x1 + cols
        x = tl.load(x_ptr + row, mask=col_mask, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + row, mask=col_mask, other=0.0)
        bc = seq * stride_b0 + t * stride_b1 + ns
        b = tl.load(b_ptr + bc, mask=n_mask, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + bc, mask=n_mask, other=0.0).to(tl.float32)
        h = h * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * b[None, :]
        y = tl.sum(h * c[None, :], 1) + d * x
        tl.store(y_ptr + row, y, mask=col_mask)
    tl.store(state_at, h.to(state_ptr.dtype.element_ty), mask=both)


def selective_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   c: torch.Tensor, d: torch.Tensor, states: torch.Tensor, slots: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """x and dt [B, L, C] (dt float32), a [C, N] float32, b and c [B, L, N], d [C]; states
    [slots, C, N] updated in place at `slots`; each sequence's first lengths[i] tokens are
    scanned. Returns y [B, L, C] in float32 (past a sequence's length: zeros)."""
    x, dt, b, c = (t.contiguous() for t in (x, dt, b, c))
    a, d = a.float().contiguous(), d.contiguous()
    assert states.stride(-1) == 1 and states.stride(1) == states.shape[2]
    runs, longest, channels = x.shape
    y = torch.zeros(runs, longest, channels, dtype=torch.float32, device=x.device)
    if runs == 0 or longest == 0:
        return y
    block_c = min(triton.next_power_of_2(channels), 64)
    _selective_scan_kernel[(runs, triton.cdiv(channels, block_c))](
        x, dt, a, b, c, d, states, slots, lengths, y,
        x.stride(0), x.stride(1), b.stride(0), b.stride(1), states.stride(0), states.stride(1),
        channels, a.shape[1], BLOCK_C=block_c, BLOCK_N=triton.next_power_of_2(a.shape[1]))
    return y
