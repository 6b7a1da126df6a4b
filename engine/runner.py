"""Model runner: owns the model and the KV pool tensors, turns a scheduled step into logits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenmill.engine.decode_graphs import GRAPH_SPLIT_TOKENS, DecodeGraphs, graph_batch_sizes
from tokenmill.engine.kv_cache.layout import SCALE_DTYPE, KVCacheLayout
from tokenmill.engine.kv_cache.manager import slot_index
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.models.decoder import CausalLM
from tokenmill.engine.prompt_logprobs import PromptRows, rows_to_score, score_rows
from tokenmill.engine.request import Sequence
from tokenmill.engine.step_buffers import StepBuffers


@dataclass
class StepInputs:
    """One step in plain lists: built by rank 0's scheduler, sent to the other ranks as is."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    all_logits: bool = False
    prompt_rows: PromptRows = field(default_factory=PromptRows)  # rows scoring prompt tokens


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, layout: KVCacheLayout,
                 device: torch.device, attention_backend: str = "torch"):
        self.model = model
        self.attention_backend = attention_backend  # "torch" or "triton", already resolved
        self.device = device
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = layout.block_size
        # Zeroed, not empty: attention reads masked-out slots too (0 * NaN would be NaN).
        self.kv_pool = torch.zeros(layout.values_shape(num_blocks), dtype=layout.dtype,
                                   device=device)
        self.kv_scales = (torch.zeros(layout.scales_shape(num_blocks), dtype=SCALE_DTYPE,
                                      device=device) if layout.quantized else None)
        self.kv_caches = [self._layer_view(i) for i in range(layout.num_layers)]
        # Called with each step's inputs before it runs: rank 0 sends them to the other ranks.
        self.on_step: Callable[[StepInputs], None] | None = None
        self.buffers = StepBuffers(device)
        self.graphs: DecodeGraphs | None = None
        # The latest step's prompt-token scores (engine/prompt_logprobs.py), None without any.
        self.prompt_scores: torch.Tensor | None = None

    def _layer_view(self, layer: int) -> KVLayer:
        k, v = self.kv_pool[layer]
        if self.kv_scales is None:
            return KVLayer(k, v)
        k_scale, v_scale = self.kv_scales[layer]
        return KVLayer(k, v, k_scale, v_scale)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of shared blocks (values and scales), before the step that writes into
        the copies."""
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            # A quantized pool is copied as bytes: index kernels do not cover float8 everywhere.
            pool = self.kv_pool.view(torch.uint8) if self.layout.quantized else self.kv_pool
            pool[:, :, dst] = pool[:, :, src]
            if self.kv_scales is not None:
                self.kv_scales[:, :, dst] = self.kv_scales[:, :, src]

    def execute(self, scheduled: list[tuple[Sequence, int]], all_logits: bool = False,
                block_copies: list[tuple[int, int]] | None = None) -> torch.Tensor:
        """Run one step; return logits for the last new token of every sequence, in order
        (every new token's with all_logits: scoring a text, engine/scoring.py). Shared blocks
        listed in block_copies are copied first (copy-on-write)."""
        inputs = self.prepare(scheduled, all_logits, block_copies or [])
        if self.on_step is not None:
            self.on_step(inputs)
        return self.run(inputs)

    def prepare(self, scheduled: list[tuple[Sequence, int]], all_logits: bool = False,
                block_copies: list[tuple[int, int]] | None = None) -> StepInputs:
        """The step as plain lists: what every tensor-parallel rank needs to run it."""
        inputs = StepInputs(block_copies=list(block_copies or []), all_logits=all_logits)
        bs = self.block_size
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            end = start + num_new
            inputs.input_ids += seq.token_slice(start, end)
            table = seq.block_table
            for pos in range(start, end):
                inputs.positions.append(pos)
                inputs.slots.append(slot_index(table, pos, bs))
            inputs.seq_lens.append(end)
            inputs.query_lens.append(num_new)
            inputs.block_tables.append(list(table))
        inputs.prompt_rows = rows_to_score(scheduled)
        return inputs

    @torch.inference_mode()
    def capture_decode_graphs(self, max_num_seqs: int, max_num_batched_tokens: int,
                              max_model_len: int) -> None:
        """Capture the decode step for every batch-size bucket (engine/decode_graphs.py). The
        input buffers are sized for the largest step first: graphs keep their addresses."""
        if self.attention_backend != "triton":
            raise ValueError("decode graphs need the Triton attention backend")
        max_blocks = -(-max_model_len // self.block_size) + 1
        self.buffers.reserve(max_num_batched_tokens, max_num_seqs, max_blocks)
        splits = -(-max_model_len // GRAPH_SPLIT_TOKENS)

        def forward(num_seqs: int, seq_lens: list[int]) -> torch.Tensor:
            views = self.buffers.views(num_seqs, num_seqs)
            meta = self.buffers.metadata(views, seq_lens, [1] * num_seqs, self.attention_backend,
                                         max_seq_len=max_model_len, decode_splits=splits)
            return self.model(views.input_ids, views.positions, self.kv_caches, meta)

        self.graphs = DecodeGraphs(self.buffers, forward, graph_batch_sizes(max_num_seqs),
                                   self.device)

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        self.copy_blocks(inputs.block_copies)
        self.prompt_scores = None
        decode_only = all(n == 1 for n in inputs.query_lens)
        if (self.graphs is not None and decode_only and not inputs.all_logits
                and not inputs.prompt_rows.rows):
            hidden = self.graphs.run(inputs.input_ids, inputs.positions, inputs.slots,
                                     inputs.seq_lens, inputs.block_tables)
            if hidden is not None:
                return self.model.logits(hidden)
        views = self.buffers.fill(inputs.input_ids, inputs.positions, inputs.slots,
                                  inputs.seq_lens, inputs.query_lens, inputs.block_tables)
        meta = self.buffers.metadata(views, inputs.seq_lens, inputs.query_lens,
                                     self.attention_backend)
        hidden = self.model(views.input_ids, views.positions, self.kv_caches, meta)
        if inputs.prompt_rows.rows:
            self.prompt_scores = score_rows(self.model, hidden, inputs.prompt_rows)
        if inputs.all_logits or decode_only:  # decode: every row is its sequence's last
            return self.model.logits(hidden)
        return self.model.logits(hidden[views.query_start[1:] - 1])
