"""A step's input tensors, allocated once and refilled every step.

Each step's integers (token ids, positions, slots, context lengths, query starts) travel to the
device in one copy, and its block tables in a second, into tensors whose addresses never change:
a captured CUDA graph reads its inputs from fixed addresses, and no step pays for allocating
its inputs. Capacity grows while the engine warms up; once graphs are captured it is frozen.

Triton compiles a kernel once per class of its arguments, and a pointer's class includes whether
it is 16-byte aligned. So every view starts on 16 bytes whatever the step's shape (each segment
of the flat buffer is padded to an even length), and a block table's row stride is a multiple
of 16 elements: else steps of an odd and an even number of tokens or sequences would each compile
their own kernels, the first request of each shape stalling on the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from tokenmill.engine.layers.attention_metadata import AttentionMetadata

PAD_SLOT = -1  # a padding row's KV slot: the KV write skips it
ALIGN = 2  # int64 elements in 16 bytes
TABLE_WIDTH_MULTIPLE = 16  # Triton's class of an integer argument: a multiple of 16 or not


def aligned(n: int, multiple: int = ALIGN) -> int:
    return -(-n // multiple) * multiple


@dataclass
class StepTensors:
    """Views of the buffers for one step of `num_tokens` tokens in `num_seqs` sequences."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    query_start: torch.Tensor
    block_tables: torch.Tensor
    lora_slots: torch.Tensor  # each token row's LoRA adapter slot, PAD_SLOT for none
    state_slots: torch.Tensor  # each sequence's recurrent-state slot, PAD_SLOT for none


class StepBuffers:
    def __init__(self, device: torch.device, max_tokens: int = 256, max_seqs: int = 64,
                 max_blocks: int = 64):
        self.device = device
        self.frozen = False
        self._pin = device.type == "cuda"
        # The last step's copies out of the pinned host buffers; refilling them waits for it.
        self._copied = torch.cuda.Event() if self._pin else None
        self._allocate(max_tokens, max_seqs, max_blocks)

    def _allocate(self, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        if self.frozen:
            raise RuntimeError(f"a step of {max_tokens} tokens, {max_seqs} sequences, "
                               f"{max_blocks} blocks each exceeds the captured input buffers")
        max_blocks = aligned(max_blocks, TABLE_WIDTH_MULTIPLE)
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        # ids, positions, KV slots and LoRA slots per token; context length, recurrent-state
        # slot and query start per sequence; each segment padded to an even length.
        flat = 4 * aligned(max_tokens) + 2 * aligned(max_seqs) + max_seqs + 1
        self._flat = torch.zeros(flat, dtype=torch.long, device=self.device)
        self._flat_host = torch.zeros(flat, dtype=torch.long, pin_memory=self._pin)
        self._tables = torch.zeros(max_seqs, max_blocks, dtype=torch.long, device=self.device)
        self._tables_host = torch.zeros(max_seqs, max_blocks, dtype=torch.long,
                                        pin_memory=self._pin)
        # Each host table row's blocks as last written (the rest of the row is zero): a row
        # whose sequence and blocks are unchanged since then is not written again.
        self._written: list[list[int]] = [[] for _ in range(max_seqs)]

    def reserve(self, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        """Grow to hold at least this step shape; never shrinks."""
        if (max_tokens > self.max_tokens or max_seqs > self.max_seqs
                or max_blocks > self.max_blocks):
            self._allocate(max(max_tokens, self.max_tokens), max(max_seqs, self.max_seqs),
                           max(max_blocks, self.max_blocks))

    def views(self, num_tokens: int, num_seqs: int) -> StepTensors:
        """The buffers as one step of this shape sees them: the same addresses every time."""
        n, t, s = num_tokens, aligned(num_tokens), aligned(num_seqs)
        flat = self._flat
        return StepTensors(
            input_ids=flat[:n], positions=flat[t:t + n], slots=flat[2 * t:2 * t + n],
            lora_slots=flat[3 * t:3 * t + n], seq_lens=flat[4 * t:4 * t + num_seqs],
            state_slots=flat[4 * t + s:4 * t + s + num_seqs],
            query_start=flat[4 * t + 2 * s:4 * t + 2 * s + num_seqs + 1],
            block_tables=self._tables[:num_seqs],
        )

    def fill(self, input_ids: list[int], positions: list[int], slots: list[int],
             seq_lens: list[int], query_lens: list[int], block_tables: list[list[int]],
             lora_slots: list[int] | None = None,
             sampled: torch.Tensor | None = None,
             state_slots: list[int] | None = None) -> StepTensors:
        """Copy one step's lists in (two host-to-device copies) and return its views.
        lora_slots: each token row's adapter slot (None: no row has one); state_slots: each
        sequence's recurrent-state slot (None: no model layer keeps one). sampled: the previous
        step's sampled tokens, still on the device, for input ids written as -1 - row (their
        row in it); their host copy need not have arrived (StepInputs.sampled_ids).

        Rows of block_tables may be ragged; only the columns a row lists are written, which
        are all any kernel reads of it (its context length bounds them).
        """
        t, s = len(input_ids), len(seq_lens)
        width = max(len(row) for row in block_tables)
        self.reserve(t, s, width)
        if self._copied is not None:
            self._copied.synchronize()
        # Each list goes into its segment through numpy, which converts a list of ints several
        # times faster than torch.tensor; the padding between segments is never read.
        flat, a, q = self._flat_host.numpy(), aligned(t), aligned(s)
        flat[:t] = input_ids
        flat[a:a + t] = positions
        flat[2 * a:2 * a + t] = slots
        flat[3 * a:3 * a + t] = PAD_SLOT if lora_slots is None else lora_slots
        flat[4 * a:4 * a + s] = seq_lens
        flat[4 * a + q:4 * a + q + s] = PAD_SLOT if state_slots is None else state_slots
        flat[4 * a + 2 * q] = 0
        flat[4 * a + 2 * q + 1:4 * a + 2 * q + 1 + s] = list(accumulate(query_lens))
        used = 4 * a + 2 * q + s + 1
        self._flat[:used].copy_(self._flat_host[:used], non_blocking=self._pin)
        rows = self._tables_host.numpy()  # row by row through numpy: a fraction of building
        written = self._written            # a tensor from padded nested lists
        for i, row in enumerate(block_tables):
            before = written[i]
            if row == before:  # a decode's table between new blocks: as it is
                continue
            rows[i, :len(row)] = row
            if len(before) > len(row):
                rows[i, len(row):len(before)] = 0
            written[i] = row
        self._tables[:s, :width].copy_(self._tables_host[:s, :width], non_blocking=self._pin)
        if self._copied is not None:
            self._copied.record()
        views = self.views(t, s)
        if sampled is not None:
            ids = views.input_ids
            ids.copy_(torch.where(ids < 0, sampled[(-1 - ids).clamp(min=0)], ids))
        return views

    def metadata(self, views: StepTensors, seq_lens: list[int], query_lens: list[int],
                 backend: str, max_seq_len: int | None = None,
                 decode_splits: int | None = None,
                 unowned_rows: bool = False) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=views.slots, block_tables=views.block_tables, seq_lens=views.seq_lens,
            query_start_loc=views.query_start, seq_lens_list=seq_lens,
            query_lens_list=query_lens, backend=backend,
            max_seq_len=max_seq_len if max_seq_len is not None else max(seq_lens),
            decode_splits=decode_splits, unowned_rows=unowned_rows,
            state_slots=views.state_slots,
        )
