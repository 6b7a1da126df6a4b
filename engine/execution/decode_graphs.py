"""CUDA graphs of the decode step, one per batch-size bucket (as vLLM and nano-vllm do).

A decode step launches several kernels per layer for a few microseconds of work each, so the
GPU waits on the host. A captured graph replays all of a step's launches at once. Graphs are
captured at start-up for batch sizes 1, 2, 4 and every multiple of 8 up to max_num_seqs; a step
of n sequences replays the smallest bucket that holds n, the rows past n being padding: slot -1
(the KV write skips them), a one-token context, outputs dropped.

A speculative verify step gives each sequence up to K+1 new tokens (its proposals and the
token after them). Its graphs (`query_len` K+1) run the extend kernel, which reads every
sequence's query length from the device, so one graph per bucket serves any mix of lengths up
to K+1: the step's tokens are packed first, and the rows after them, which no sequence owns,
are padding (slot -1, attention output zero, outputs dropped); padding sequences have no rows.

Everything a graph reads lives at fixed addresses (step_buffers.py), each token row's LoRA
adapter slot too (padding rows -1: no adapter), so one graph serves any mix of adapters, and
each sequence's recurrent-state slot (a linear-attention model's; padding sequences -1, the
slot of no sequence).
Where CUDA graphs do not exist (CPU), `ReplayedEagerly` keeps their contract, so the
bucketed, padded, fixed-buffer path runs and is tested on every machine.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch

from tokenmill.engine.execution.step_buffers import PAD_SLOT, StepBuffers

log = logging.getLogger(__name__)

MAX_GRAPH_BATCH = 512  # larger decode batches run eagerly: their launches are amortized
GRAPH_SPLIT_TOKENS = 256  # the shortest context split of a graphed decode step
GRAPH_TARGET_PROGRAMS = 1024  # (sequence, K/V head, split) programs a graphed decode aims at

# forward(num_seqs, query_len): the model over the buffers' views for that many sequences of
# query_len new tokens each.
Forward = Callable[[int, int], torch.Tensor]


def graph_batch_sizes(max_num_seqs: int, chosen: tuple[int, ...] | None = None) -> list[int]:
    """1, 2, 4, 8, 16, 24, ... up to max_num_seqs (itself included), at most MAX_GRAPH_BATCH.
    With --cuda-graph-sizes (`chosen`, sorted): one value lowers that top to it; several are
    the sizes themselves, those a batch can reach (none: every step runs eagerly)."""
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    if chosen is not None and len(chosen) > 1:
        return [n for n in chosen if n <= top]
    if chosen is not None:
        top = min(top, chosen[0])
    sizes = [b for b in (1, 2, 4) if b <= top] + list(range(8, top + 1, 8))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def graph_decode_splits(num_seqs: int, num_kv_heads: int, max_model_len: int) -> int:
    """Context splits of the decode kernel in the graph of `num_seqs` sequences. A graph cannot
    see the step's lengths, so its splits cover max_model_len: a small batch takes many (at
    least GRAPH_SPLIT_TOKENS long each, so that a short context still spreads over several
    programs), a large one few, down to one per sequence, since every split past a sequence's
    end still costs a program, a partial output written and read back in the merge."""
    most = -(-max_model_len // GRAPH_SPLIT_TOKENS)
    wanted = -(-GRAPH_TARGET_PROGRAMS // (num_seqs * num_kv_heads))
    return max(1, min(most, wanted))


def bucket_for(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured batch size that holds num_seqs; None: run it eagerly."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def graphs_wanted(device_type: str, attention_backend: str, enforce_eager: bool,
                  mixture_of_experts: bool = False, sparse_attention: bool = False) -> bool:
    """CUDA graphs on CUDA with the Triton kernels (the torch attention reads host lists of
    the step, which a replay would not see), unless --enforce-eager. Not for a mixture of
    experts: its layers read each expert's row count on the host (layers/moe.py), which a
    capture cannot; nor for sparse attention (DeepSeek-V3.2's), which chooses its path by the
    step's context lengths on the host."""
    return device_type == "cuda" and attention_backend == "triton" and not enforce_eager \
        and not mixture_of_experts and not sparse_attention


class ReplayedEagerly:
    """A captured graph's contract without CUDA: `replay()` recomputes `output` in place from
    the same fixed input buffers."""

    def __init__(self, fn: Callable[[], torch.Tensor], pool: object = None):
        self._fn = fn
        self.output = fn()

    def replay(self) -> None:
        self.output.copy_(self._fn())


class CapturedGraph:
    def __init__(self, fn: Callable[[], torch.Tensor], pool: object):
        fn()  # warm-up outside the capture: Triton compiles its kernels here
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = fn()

    def replay(self) -> None:
        self.graph.replay()


class DecodeGraphs:
    """One graph per bucket, all reading the same StepBuffers; each runs the model for `size`
    sequences of up to `query_len` new tokens (1: decode)."""

    def __init__(self, buffers: StepBuffers, forward: Forward, sizes: list[int],
                 device: torch.device, query_len: int = 1):
        self.buffers = buffers
        self.sizes = sizes
        self.query_len = query_len
        self.graphs: dict[int, CapturedGraph | ReplayedEagerly] = {}
        self.replays = 0  # steps served by a graph
        kind = CapturedGraph if device.type == "cuda" else ReplayedEagerly
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        start = time.perf_counter()
        # Largest first: the smaller graphs reuse its memory pool.
        for size in reversed(sizes):
            self._fill(size, [], [], [], [], [], [], state_slots=[])
            self.graphs[size] = kind(lambda size=size: forward(size, query_len), pool)
        buffers.frozen = True
        log.info("captured step graphs", extra={
            "query_len": query_len, "batch_sizes": len(sizes), "largest": sizes[-1],
            "seconds": round(time.perf_counter() - start, 2)})

    def _fill(self, size: int, input_ids: list[int], positions: list[int], slots: list[int],
              seq_lens: list[int], query_lens: list[int], block_tables: list[list[int]],
              lora_slots: list[int] | None = None, sampled: torch.Tensor | None = None,
              state_slots: list[int] | None = None) -> None:
        pad_seqs = size - len(seq_lens)
        pad_rows = size * self.query_len - len(input_ids)
        # Decode: a padding sequence owns its one padding row. Verify: padding rows are owned
        # by no sequence, and padding sequences have none.
        pad_query = 1 if self.query_len == 1 else 0
        self.buffers.fill(input_ids + [0] * pad_rows, positions + [0] * pad_rows,
                          slots + [PAD_SLOT] * pad_rows, seq_lens + [1] * pad_seqs,
                          query_lens + [pad_query] * pad_seqs, block_tables + [[0]] * pad_seqs,
                          (lora_slots or [PAD_SLOT] * len(input_ids)) + [PAD_SLOT] * pad_rows,
                          sampled,
                          (state_slots or [PAD_SLOT] * len(seq_lens)) + [PAD_SLOT] * pad_seqs)

    def holds(self, query_lens: list[int]) -> bool:
        """Whether a step of these query lengths fits a graph of this set."""
        return (bool(query_lens) and bucket_for(len(query_lens), self.sizes) is not None
                and max(query_lens) <= self.query_len)

    def run(self, input_ids: list[int], positions: list[int], slots: list[int],
            seq_lens: list[int], query_lens: list[int], block_tables: list[list[int]],
            lora_slots: list[int] | None = None,
            sampled: torch.Tensor | None = None,
            state_slots: list[int] | None = None) -> torch.Tensor | None:
        """Hidden states of the step's tokens, or None when no graph holds the step.
        lora_slots: each token row's adapter slot (None: none has one; padding rows none);
        sampled, state_slots: as StepBuffers.fill's (padding sequences hold the slot of no
        sequence)."""
        if not self.holds(query_lens):
            return None
        size = bucket_for(len(seq_lens), self.sizes)
        self._fill(size, input_ids, positions, slots, seq_lens, query_lens, block_tables,
                   lora_slots, sampled, state_slots)
        graph = self.graphs[size]
        graph.replay()
        self.replays += 1
        return graph.output[:len(input_ids)]
