"""LoRA on a projection for a batch that mixes adapters (Punica-style): every token row reads
the adapter in its own device slot.

Each wrapped projection keeps a pool of `max_loras` slots, stacked over its parts (q, k, v or
gate, up): a_pool [slots, P * max_rank, in], b_pool [slots, out, P * max_rank], part p's A in
rows p*max_rank.. (zero-padded to max_rank) and its B in its own output rows and those rank
columns, so B is block-diagonal and one pair of matmuls serves the merged layer. The adapter's
scaling is folded into B. The delta of token row t is (x[t] @ a_pool[s].T) @ b_pool[s].T with
s = token_slots[t]; slot -1 is the base model.

`lora_apply_reference` is the torch reference (rows grouped by slot, fine on CPU); the Triton
kernel `kernels/lora.py` has the same signature and semantics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

NO_SLOT = -1  # a token row of the base model


@dataclass
class SlotPlan:
    """How one step's rows group by adapter slot, found once for every layer (one host
    synchronization, torch path only). Every slot present gets the same number of rows, the
    shorter groups padded with row 0 (its delta masked to zero), so each layer's delta is two
    batched matmuls over all adapters instead of a pair of small ones per adapter."""

    slots: torch.Tensor | None  # [S'] the slots present, ascending (None: all of them)
    rows: torch.Tensor          # [S' * M] each group's token rows, padded
    keep: torch.Tensor | None   # [S' * M, 1] 1 for a real row, 0 for padding (None: none)
    group: int                  # M: rows per group

    @classmethod
    def of(cls, token_slots: torch.Tensor, dtype: torch.dtype,
           num_slots: int) -> SlotPlan | None:
        """None when no row has an adapter."""
        present = [s for s in token_slots.unique().tolist() if s >= 0]
        if not present:
            return None
        groups = [(token_slots == s).nonzero().squeeze(1) for s in present]
        width = max(len(g) for g in groups)
        rows = torch.zeros(len(groups), width, dtype=torch.long, device=token_slots.device)
        keep = torch.zeros(len(groups), width, 1, dtype=dtype, device=token_slots.device)
        for i, g in enumerate(groups):
            rows[i, :len(g)] = g
            keep[i, :len(g)] = 1
        # Slicing the pools by slot copies them: skip it when every slot is present.
        slots = None if present == list(range(num_slots)) else torch.tensor(
            present, device=token_slots.device)
        padded = any(len(g) < width for g in groups)
        return cls(slots, rows.view(-1), keep.view(-1, 1) if padded else None, width)


def lora_apply_reference(x: torch.Tensor, y: torch.Tensor, a_pool: torch.Tensor,
                         b_pool: torch.Tensor, token_slots: torch.Tensor,
                         plan: SlotPlan | None = None) -> None:
    """y[t] += (x[t] @ a_pool[s_t].T) @ b_pool[s_t].T for rows with s_t >= 0, in place.
    `plan` (SlotPlan.of token_slots) saves grouping the rows again in every layer."""
    plan = plan if plan is not None else SlotPlan.of(token_slots, x.dtype, a_pool.shape[0])
    if plan is None:
        return
    if plan.slots is not None:
        a_pool, b_pool = a_pool[plan.slots], b_pool[plan.slots]
    xs = x[plan.rows].view(a_pool.shape[0], plan.group, x.shape[-1])
    delta = torch.bmm(torch.bmm(xs, a_pool.transpose(1, 2)), b_pool.transpose(1, 2))
    delta = delta.view(-1, y.shape[-1])
    y.index_add_(0, plan.rows, delta if plan.keep is None else delta * plan.keep)


@functools.cache
def _kernel() -> Callable[..., None]:
    from tokenmill.engine.kernels.lora import lora_apply as kernel

    return kernel


def lora_apply(x: torch.Tensor, y: torch.Tensor, a_pool: torch.Tensor, b_pool: torch.Tensor,
               token_slots: torch.Tensor, backend: str, plan: SlotPlan | None = None) -> None:
    """The batched LoRA delta added to y: the Triton kernel for backend "triton" (no host
    synchronization, so the decode graphs capture it), the torch reference for "torch"."""
    if backend == "triton":
        _kernel()(x, y, a_pool, b_pool, token_slots)
        return
    lora_apply_reference(x, y, a_pool, b_pool, token_slots, plan)


class LoRAContext:
    """What every LoRA layer of a model reads for the current step: each token row's slot
    (a view of the step buffers, a CUDA graph input) and whether any row has an adapter (an
    eager step with none skips the delta; a captured graph always computes it)."""

    def __init__(self, max_loras: int, max_rank: int, backend: str, dtype: torch.dtype):
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.backend = backend
        self.dtype = dtype  # the activations': the pools are in it, whatever the base stores
        self.token_slots: torch.Tensor | None = None
        self.active = False
        self._plan: SlotPlan | None = None
        self._planned = False

    def set_step(self, token_slots: torch.Tensor, active: bool) -> None:
        self.token_slots = token_slots
        self.active = active
        self._plan, self._planned = None, False

    def plan(self) -> SlotPlan | None:
        """The step's rows grouped by slot, found once for every layer (torch path only: the
        Triton path must not synchronize)."""
        if self.backend != "torch":
            return None
        if not self._planned:
            self._plan = SlotPlan.of(self.token_slots, self.dtype, self.max_loras)
            self._planned = True
        return self._plan


class LoRALinear(nn.Module):
    """A projection (nn.Linear, MergedLinear or their quantized twins) plus the batched LoRA
    delta. `parts` are the local output sizes of a merged layer's parts (one part otherwise);
    the base layer is called as before and returns what it returned (split or whole)."""

    def __init__(self, base: nn.Module, context: LoRAContext):
        super().__init__()
        self.base = base
        self.context = context
        merged = getattr(base, "parts", None)
        self.parts: dict[str, int] = dict(merged) if merged else {"": base.out_features}
        self.merged = merged is not None
        width = len(self.parts) * context.max_rank
        like = dict(dtype=context.dtype, device=base.weight.device)
        self.register_buffer("a_pool", torch.zeros(context.max_loras, width, base.in_features,
                                                   **like), persistent=False)
        self.register_buffer("b_pool", torch.zeros(context.max_loras, base.out_features, width,
                                                   **like), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if not self.context.active:
            return self.base(x)
        y = self.base.forward_merged(x) if self.merged else self.base(x)
        rows = y.reshape(-1, y.shape[-1])
        lora_apply(x.reshape(-1, x.shape[-1]), rows, self.a_pool, self.b_pool,
                   self.context.token_slots, self.context.backend, self.context.plan())
        return y.split(list(self.parts.values()), dim=-1) if self.merged else y

    def clear_slot(self, slot: int) -> None:
        self.a_pool[slot].zero_()
        self.b_pool[slot].zero_()

    def set_part(self, slot: int, part: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Write part `part`'s A [r, in] and scaled B [out_part, r] (this rank's shards)."""
        rank, start = a.shape[0], part * self.context.max_rank
        first_row = sum(list(self.parts.values())[:part])
        self.a_pool[slot, start:start + rank] = a
        self.b_pool[slot, first_row:first_row + b.shape[0], start:start + rank] = b
