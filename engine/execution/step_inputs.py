"""One engine step as plain data: what the core hands the execution layer (and rank 0 sends
every tensor-parallel rank as is). Nothing here knows requests or sequences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def slot_index(block_table: list[int], position: int, block_size: int) -> int:
    """The pool slot holding the KV of token `position` of a sequence with this block table."""
    return block_table[position // block_size] * block_size + position % block_size


@dataclass
class PromptRows:
    """The rows of one step that score prompt tokens (prompt logprobs)."""

    rows: list[int] = field(default_factory=list)     # flat token rows of the step
    targets: list[int] = field(default_factory=list)  # the prompt token each row scores
    top_k: int = 0                                     # the most any of their requests asks


@dataclass
class StepInputs:
    """One step in plain lists, one entry per scheduled sequence (or per new token)."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # Host tier copies as (device block, host block), run before the forward pass (to host
    # first): blocks the device pool evicts, and cached prefixes brought back.
    kv_to_host: list[tuple[int, int]] = field(default_factory=list)
    kv_to_device: list[tuple[int, int]] = field(default_factory=list)
    all_logits: bool = False
    # Logit rows per sequence, its last new tokens' (1 unless its proposals are verified: one
    # per proposal and one after them).
    num_logits: list[int] = field(default_factory=list)
    prompt_rows: PromptRows = field(default_factory=PromptRows)  # rows scoring prompt tokens
    # Flat row ranges [start, end) whose hidden states the step sums for embeddings (the
    # pooling runner), in the order the core asked for them.
    pool_spans: list[tuple[int, int]] = field(default_factory=list)
    # Each sequence's LoRA adapter slot (-1: the base model), and the adapters every rank
    # loads into their slots before the forward pass: (slot, adapter directory on local disk).
    lora_slots: list[int] = field(default_factory=list)
    lora_loads: list[tuple[int, str]] = field(default_factory=list)
    # Each token row's type (BERT's segments of a scored pair); empty where no sequence of
    # the step has types (all 0).
    token_types: list[int] = field(default_factory=list)
    # (flat row, rows [n, hidden]) of prompt images: the image encoder's rows replace the
    # embeddings of n placeholder tokens from that row on.
    image_rows: list[tuple[int, Any]] = field(default_factory=list)
    # (flat row, rows [n, hidden]) of prompts given as embeddings: the decoder writes them
    # over the embeddings of the n placeholder tokens from that row on.
    embed_rows: list[tuple[int, Any]] = field(default_factory=list)
    # Each token row's last visible position, where some row sees past itself (an image's
    # rows see the whole image, both ways); empty: causal.
    visible_until: list[int] = field(default_factory=list)
    # Each token row's (frame, row, column) rotary positions, as three lists, where some row
    # of an image takes 3-D positions (Qwen2-VL's M-RoPE); empty: `positions` are every
    # row's.
    grid_positions: list[list[int]] = field(default_factory=list)
    # Whether some input id is -1 - r: the r-th token the previous step sampled, still on the
    # device (async scheduling schedules a step before the previous step's tokens are read),
    # and how many tokens it sampled (rank 0 broadcasts them to the other ranks).
    sampled_ids: bool = False
    num_sampled: int = 0
    # Each sequence's recurrent-state slot (a model with linear-attention layers; -1: the
    # slot of no sequence), and the copies (source, destination) of forks' states to run
    # first.
    state_slots: list[int] = field(default_factory=list)
    state_copies: list[tuple[int, int]] = field(default_factory=list)

    def add_sequence(self, token_ids: list[int], start: int, block_table: list[int],
                     block_size: int, num_logits: int = 1, lora_slot: int = -1,
                     position_shift: int = 0, state_slot: int = -1) -> None:
        """A sequence whose new tokens `token_ids` sit at positions start.. (its context ends
        with them), with logits for its last num_logits of them. position_shift: how far
        their rotary positions lie from their indices (images with 3-D positions before
        them)."""
        self.num_logits.append(num_logits)
        self.lora_slots.append(lora_slot)
        self.state_slots.append(state_slot)
        end = start + len(token_ids)
        self.input_ids += token_ids
        if end - start == 1:  # a decode
            self.positions.append(start + position_shift)
            self.slots.append(slot_index(block_table, start, block_size))
        else:
            self.positions += range(start + position_shift, end + position_shift)
            self.slots += [slot_index(block_table, p, block_size) for p in range(start, end)]
        self.seq_lens.append(end)
        self.query_lens.append(len(token_ids))
        self.block_tables.append(list(block_table))

    def logit_rows(self) -> list[int] | None:
        """The flat token rows whose logits this step returns, when some sequence asks for more
        than its last (None: each sequence's last row)."""
        if all(count == 1 for count in self.num_logits):
            return None
        rows, end = [], 0
        for query_len, count in zip(self.query_lens, self.num_logits, strict=True):
            end += query_len
            rows += range(end - count, end)
        return rows

    def token_lora_slots(self) -> list[int] | None:
        """Each token row's adapter slot, None when no sequence of the step has an adapter."""
        if all(slot < 0 for slot in self.lora_slots):
            return None
        return [slot for slot, count in zip(self.lora_slots, self.query_lens, strict=True)
                for _ in range(count)]
