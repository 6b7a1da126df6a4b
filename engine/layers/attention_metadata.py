"""What attention needs to know about a step's batch: where each sequence's tokens sit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """Layout of one step's flattened tokens.

    Sequence i owns rows query_start_loc[i]:query_start_loc[i+1] of the step's tokens; those are
    its newest tokens, so its context (cached prefix plus new tokens) is seq_lens[i] long and
    lives in the blocks block_tables[i]. slot_mapping[t] is the cache slot token t writes to.
    backend names the ops that run attention: "torch" (the reference) or "triton" (kernels).
    """

    slot_mapping: torch.Tensor      # [num_tokens] int64
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int64, padded with 0
    seq_lens: torch.Tensor          # [num_seqs] int64 (context length after this step)
    query_start_loc: torch.Tensor   # [num_seqs + 1] int64
    seq_lens_list: list[int]
    query_lens_list: list[int]
    backend: str = "torch"
    # Longest context in the step, a host int (no device sync); a captured CUDA graph sets it
    # to max_model_len, since one graph serves every later step of its batch size.
    max_seq_len: int = 0
    # Context splits of the Triton decode kernel; None lets the kernel choose per step (a
    # captured graph fixes it, so a split covers the same tokens at every replay).
    decode_splits: int | None = None
    # Rows after the last sequence's are padding that no sequence owns (a captured verify
    # graph's): attention leaves them zero, so no uninitialised value flows on.
    unowned_rows: bool = False
    # [num_tokens] int64: the last position each query sees, where some see past themselves
    # (an image's tokens attend to the whole image, both ways: Gemma 3); None: causal.
    visible_until: torch.Tensor | None = None
    # [num_seqs] int64, and as a host list: each sequence's recurrent-state slot, where the
    # model has linear-attention layers (layers/state_layer.py); None: no such layer.
    state_slots: torch.Tensor | None = None
    state_slots_list: list[int] = field(default_factory=list)
    # Per-step work that every layer shares (e.g. the torch path's decode buckets), built by the
    # first layer that needs it; keyed by whoever builds it.
    step_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.max_seq_len:
            self.max_seq_len = max(self.seq_lens_list)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)
