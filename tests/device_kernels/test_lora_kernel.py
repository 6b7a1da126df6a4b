"""The batched LoRA kernel equals a per-adapter torch reference on any mix of slots.

y[t] += (x[t] @ A[s].T) @ B[s].T for s = slots[t] >= 0, in float32, rounded once into y's dtype;
rows with slot -1 keep y bit for bit. Without a GPU the kernels run in Triton's CPU interpreter
on tiny shapes; the real size and the CUDA graph replay with new slots run on a GPU only.

Tolerances: float32 differs from the reference only in summation order (1e-5 at values of
order 1). float16 and bfloat16 round the same float32 sum once, so they differ by at most one
unit in the last place: relative 2**-10 and 2**-7 (the interpreter truncates float32 to
bfloat16 instead of rounding, still within one unit).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from triton_support import DEVICE, cuda_only

from tokenmill.engine.execution.decode_graphs import CapturedGraph
from tokenmill.engine.kernels.lora import lora_apply

TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5},
             torch.float16: {"atol": 1e-5, "rtol": 2 ** -10},
             torch.bfloat16: {"atol": 1e-5, "rtol": 2 ** -7}}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


class LoraBatch(NamedTuple):
    x: torch.Tensor  # [T, K]
    y: torch.Tensor  # [T, N], the base layer's output
    a_pool: torch.Tensor  # [S, R, K]
    b_pool: torch.Tensor  # [S, N, R]
    slots: torch.Tensor  # [T] int64


def lora_batch(slots: list[int], k_dim: int, rank: int, n_dim: int, num_slots: int,
               dtype: torch.dtype, seed: int = 0, device: torch.device = DEVICE) -> LoraBatch:
    """Random activations and adapters scaled so that y and the LoRA delta are both of order 1."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    return LoraBatch(rand(len(slots), k_dim), rand(len(slots), n_dim),
                     rand(num_slots, rank, k_dim, scale=k_dim ** -0.5),
                     rand(num_slots, n_dim, rank, scale=rank ** -0.5),
                     torch.tensor(slots, dtype=torch.long, device=device))


def lora_reference(x: torch.Tensor, y: torch.Tensor, a_pool: torch.Tensor, b_pool: torch.Tensor,
                   slots: torch.Tensor) -> torch.Tensor:
    """What lora_apply makes of y, as a new tensor: each adapter's rows get their float32
    delta added to y in float32, rounded once; rows with slot -1 round-trip unchanged."""
    out = y.to(torch.float32, copy=True)
    for slot in slots.unique().tolist():
        if slot < 0:
            continue
        rows = slots == slot
        shrunk = x[rows].float() @ a_pool[slot].float().T
        out[rows] += shrunk @ b_pool[slot].float().T
    return out.to(y.dtype)


def _check(batch: LoraBatch) -> None:
    expected = lora_reference(*batch)
    lora_apply(*batch)
    torch.testing.assert_close(batch.y, expected, **TOLERANCE[batch.y.dtype])
    untouched = batch.slots < 0
    assert torch.equal(batch.y[untouched], expected[untouched])


# (slots, K, R, N, S): N=200 spans a full and a partial column block (128), K=300 two chunks
# of the reduction (256), R=12 one partial rank block and R=48 (q/k/v parts of rank 16) three.
CASES = {
    "mixed_slots_and_no_adapter": ([0, -1, 2, 2, 1, -1, 0], 40, 12, 70, 3),
    "fused_qkv_rank_48": ([1, 0, -1, 1, 3], 64, 48, 200, 4),
    "single_token": ([2], 300, 12, 40, 3),
    "all_rows_one_slot": ([1, 1, 1, 1], 32, 8, 24, 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_lora_kernel_equals_torch(dtype, case):
    _check(lora_batch(*case, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_without_adapter_keep_y_bit_for_bit(dtype):
    batch = lora_batch([-1, -1, -1], 40, 12, 70, 2, dtype)
    before = batch.y.clone()
    lora_apply(*batch)
    assert torch.equal(batch.y, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_x_and_y_views(dtype):
    """y is a column slice of a wider output (one part of a merged projection), x a column slice
    of a wider input: only the slice of y changes."""
    wide = lora_batch([0, 1, -1, 1], 56, 12, 100, 2, dtype)
    x, wide_y = wide.x[:, 8:48], wide.y
    columns = slice(20, 90)
    a_pool = wide.a_pool[:, :, :40].contiguous()
    b_pool = wide.b_pool[:, :70].contiguous()
    before = wide_y.clone()
    batch = LoraBatch(x, wide_y[:, columns], a_pool, b_pool, wide.slots)
    assert batch.y.stride(0) == 100 and batch.x.stride(0) == 56
    expected = lora_reference(x, before[:, columns], a_pool, b_pool, wide.slots)
    lora_apply(*batch)
    torch.testing.assert_close(wide_y[:, columns], expected, **TOLERANCE[dtype])
    assert torch.equal(wide_y[:, :20], before[:, :20])
    assert torch.equal(wide_y[:, 90:], before[:, 90:])


def test_empty_batch():
    batch = lora_batch([], 16, 4, 8, 1, torch.float32)
    lora_apply(*batch)
    assert batch.y.shape == (0, 8)


@cuda_only
def test_lora_kernel_equals_torch_at_real_size():
    """A q/k/v projection of Llama-3.1-8B's width with four adapters of stacked rank 48."""
    slots = (torch.arange(256) % 5 - 1).tolist()  # -1, 0, 1, 2, 3 in turn
    _check(lora_batch(slots, 4096, 48, 6144, 4, torch.bfloat16))


@cuda_only
def test_captured_graph_replays_with_new_slots():
    """One capture serves any later mix of adapters: the slots tensor is rewritten in place
    between replays and each replay equals the reference for the new slots."""
    batch = lora_batch([0] * 64, 512, 48, 1024, 4, torch.bfloat16)
    base = batch.y.clone()

    def step() -> torch.Tensor:
        batch.y.copy_(base)
        lora_apply(*batch)
        return batch.y

    graph = CapturedGraph(step, torch.cuda.graph_pool_handle())
    gen = torch.Generator().manual_seed(1)
    for slots in (torch.full((64,), -1), torch.randint(-1, 4, (64,), generator=gen),
                  torch.full((64,), 3)):
        batch.slots.copy_(slots)
        graph.replay()
        expected = lora_reference(batch.x, base, batch.a_pool, batch.b_pool, batch.slots)
        torch.testing.assert_close(graph.output, expected, **TOLERANCE[torch.bfloat16])
        untouched = batch.slots < 0
        assert torch.equal(graph.output[untouched], base[untouched])
