"""The recurrent-state pool of a model with linear-attention layers (Qwen3.5's and Qwen3-Next's
gated delta nets, the Mamba-2 layers of Granite 4.0-H and Nemotron-H): per such layer, a slot
per running sequence (--max-num-seqs of them), the prefix cache's checkpoints, and one for
rows of no sequence, each holding a convolution's inputs and a delta rule's or scan's state.
Unlike keys and values a state does not grow with the context: a sequence holds one slot from
admission to its end (core/kv_cache/state_slots.py), which is zeroed as it starts, copied as
it forks (n > 1) and copied from a checkpoint where it resumes from a cached prefix."""

from __future__ import annotations

import math

import torch

from tokenmill.engine.contract.model_shape import LinearAttention, Mamba2
from tokenmill.engine.execution.zeroed import zeroed
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.layers.to_device import list_to_device


def ssm_dtype(name: str) -> torch.dtype:
    """--mamba-ssm-cache-dtype: auto keeps the delta rule's state in float32, as
    transformers does."""
    return torch.float32 if name == "auto" else getattr(torch, name)


def checkpoint_slots(max_num_seqs: int, prefix_caching: bool, mode: str = "align") -> int:
    """State slots for the prefix cache's checkpoints (core/kv_cache/state_checkpoints.py):
    one per four sequence slots, at least one, where prefix caching is on and
    --mamba-cache-mode is align."""
    return max(1, max_num_seqs // 4) if prefix_caching and mode == "align" else 0


def state_pool_bytes(shape: LinearAttention | Mamba2, num_layers: int, num_slots: int,
                     dtype: torch.dtype, state_dtype: torch.dtype) -> int:
    """What RecurrentStates of these sizes allocate."""
    per_slot = shape.conv_channels * (shape.conv_kernel - 1) * dtype.itemsize + \
        math.prod(shape.state_shape) * state_dtype.itemsize
    return num_layers * (num_slots + 1) * per_slot


class RecurrentStates:
    def __init__(self, shape: LinearAttention | Mamba2, num_layers: int, num_slots: int,
                 dtype: torch.dtype, device: torch.device,
                 state_dtype: torch.dtype = torch.float32):
        """`dtype`: the convolution's inputs' (the model's); `state_dtype`: the rule's."""
        self.num_slots = num_slots
        self.device = device
        rows = num_slots + 1  # the last: rows of no sequence
        self.conv = zeroed((num_layers, rows, shape.conv_channels, shape.conv_kernel - 1),
                           dtype, device)
        self.ssm = zeroed((num_layers, rows, *shape.state_shape), state_dtype, device)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    def layer(self, index: int) -> StateLayer:
        """The index-th linear-attention layer's states."""
        return StateLayer(self.conv[index], self.ssm[index])

    def prepare(self, fresh: list[int], copies: list[tuple[int, int]]) -> None:
        """Before a step: copy forked sequences' states (source slot, new slot), then zero
        the slots of sequences that start in it (no state carried from a previous owner)."""
        if copies:
            src = list_to_device([s for s, _ in copies], torch.long, self.device)
            dst = list_to_device([d for _, d in copies], torch.long, self.device)
            for pool in (self.conv, self.ssm):
                pool[:, dst] = pool[:, src]
        if fresh:
            slots = list_to_device(fresh, torch.long, self.device)
            for pool in (self.conv, self.ssm):
                pool[:, slots] = 0
