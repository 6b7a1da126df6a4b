"""Batched LoRA for multi-adapter serving: y[t] += (x[t] @ A[s].T) @ B[s].T with s = slots[t].

Every adapter's weights sit in one pool (A [S, R, K], B [S, N, R]) and each token carries the
pool slot of its request's adapter (-1: no adapter). The kernel gathers the slot per token
(Punica's BGMV), so a step whose rows use any mix of adapters, or none, is the same two launches
with grids fixed by the shapes: the same code serves eager steps and CUDA graphs, where only the
slots tensor changes between replays.

Two launches of one gathered matrix-vector kernel: the shrink writes h = x @ A[s].T into a
float32 [T, R] buffer, the expand adds h @ B[s].T to y. One fused launch would recompute h for
every column block of y. Products are accumulated in float32 and the sum y + delta is rounded
once into y's dtype. Rows with slot -1 are skipped: y keeps them bit for bit. Each token is a
matrix-vector product (no tensor cores), which suits decode steps; a prefill row re-reads its
adapter's A and B, mostly from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SHRINK_BLOCK = (16, 256)  # (rank rows per program, reduction chunk over K)
EXPAND_BLOCK = (128, 16)  # (output columns per program, reduction chunk over R)


@triton.jit
def _gathered_matvec_kernel(
    v_ptr, w_ptr, out_ptr, slots_ptr, stride_vt, stride_ws, stride_wo, stride_ot, out_dim,
    in_dim, BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, ADD_TO_OUT: tl.constexpr,
):
    """out[t, o] (+)= sum_i w[s, o, i] * v[t, i] for s = slots[t], in float32 and rounded once
    into out's dtype; one program per (token, block of BLOCK_O outputs). The shrink is
    (v, w, out) = (x, A, h); the expand, adding to out, is (h, B, y)."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token)
    if slot < 0:  # no adapter: out keeps the row (h's row stays unwritten and unread)
        return
    outs = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    out_ok = outs < out_dim
    w_rows = w_ptr + slot * stride_ws + outs[:, None] * stride_wo
    acc = tl.zeros([BLOCK_O], tl.float32)
    for start in range(0, in_dim, BLOCK_I):
        ins = start + tl.arange(0, BLOCK_I)
        in_ok = ins < in_dim
        v = tl.load(v_ptr + token * stride_vt + ins, mask=in_ok, other=0.0).to(tl.float32)
        w = tl.load(w_rows + ins[None, :], mask=out_ok[:, None] & in_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * v[None, :], axis=1)
    out_row = out_ptr + token * stride_ot + outs
    if ADD_TO_OUT:
        acc += tl.load(out_row, mask=out_ok, other=0.0).to(tl.float32)
    tl.store(out_row, acc.to(out_ptr.dtype.element_ty), mask=out_ok)


def _gathered_matvec(v: torch.Tensor, w_pool: torch.Tensor, out: torch.Tensor,
                     slots: torch.Tensor, block: tuple[int, int], add_to_out: bool) -> None:
    """v [T, I], w_pool [S, O, I], out [T, O]: a grid fixed by T and O."""
    out_dim, in_dim = w_pool.shape[1:]
    block_o = min(block[0], triton.next_power_of_2(out_dim))
    block_i = min(block[1], triton.next_power_of_2(in_dim))
    _gathered_matvec_kernel[(v.shape[0], triton.cdiv(out_dim, block_o))](
        v, w_pool, out, slots, v.stride(0), w_pool.stride(0), w_pool.stride(1), out.stride(0),
        out_dim, in_dim, BLOCK_O=block_o, BLOCK_I=block_i, ADD_TO_OUT=add_to_out,
    )


def lora_apply(x: torch.Tensor, y: torch.Tensor, a_pool: torch.Tensor, b_pool: torch.Tensor,
               token_slots: torch.Tensor) -> None:
    """y[t] += (x[t] @ a_pool[s].T) @ b_pool[s].T in place for every row t whose slot
    s = token_slots[t] is >= 0; rows with slot -1 are left untouched.

    x [T, K], y [T, N] (row-strided views allowed; unit stride in the last dimension),
    a_pool [S, R, K] and b_pool [S, N, R] in x's dtype, token_slots [T] int64 on the device.
    No host synchronisation and no allocation beyond the [T, R] float32 buffer: safe to capture
    in a CUDA graph and replay with other slots.
    """
    tokens, k_dim = x.shape
    _, rank, _ = a_pool.shape
    n_dim = y.shape[1]
    assert y.shape[0] == tokens and token_slots.shape == (tokens,)
    assert a_pool.shape[2] == k_dim and b_pool.shape[1:] == (n_dim, rank)
    assert a_pool.shape[0] == b_pool.shape[0] and a_pool.dtype == b_pool.dtype == x.dtype
    assert x.stride(-1) == y.stride(-1) == a_pool.stride(-1) == b_pool.stride(-1) == 1
    assert token_slots.dtype == torch.int64 and token_slots.is_contiguous()
    if tokens == 0 or n_dim == 0 or rank == 0:
        return
    h = torch.empty(tokens, rank, dtype=torch.float32, device=x.device)
    _gathered_matvec(x, a_pool, h, token_slots, SHRINK_BLOCK, add_to_out=False)
    _gathered_matvec(h, b_pool, y, token_slots, EXPAND_BLOCK, add_to_out=True)
