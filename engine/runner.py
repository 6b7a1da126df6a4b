"""Model runner: owns the model and the KV pool tensors, turns a scheduled step into logits."""

from __future__ import annotations

import torch

from tokenmill.engine.kv_cache.layout import SCALE_DTYPE, KVCacheLayout
from tokenmill.engine.kv_cache.manager import slot_index
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.models.decoder import CausalLM
from tokenmill.engine.request import Sequence


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, layout: KVCacheLayout,
                 device: torch.device, attention_backend: str = "torch"):
        self.model = model
        self.attention_backend = attention_backend  # "torch" or "triton", already resolved
        self.device = device
        self.layout = layout
        self.block_size = layout.block_size
        # Zeroed, not empty: attention reads masked-out slots too (0 * NaN would be NaN).
        self.kv_pool = torch.zeros(layout.values_shape(num_blocks), dtype=layout.dtype,
                                   device=device)
        self.kv_scales = (torch.zeros(layout.scales_shape(num_blocks), dtype=SCALE_DTYPE,
                                      device=device) if layout.quantized else None)
        self.kv_caches = [self._layer_view(i) for i in range(layout.num_layers)]

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

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]],
                all_logits: bool = False) -> torch.Tensor:
        """Run one step; return logits for the last new token of every sequence, in order
        (every new token's with all_logits: scoring a text, engine/scoring.py)."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_lens: list[int] = []
        max_blocks = max(len(seq.block_table) for seq, _ in scheduled)
        tables = torch.zeros(len(scheduled), max_blocks, dtype=torch.long)
        bs = self.block_size
        for row, (seq, num_new) in enumerate(scheduled):
            start = seq.num_computed_tokens
            end = start + num_new
            input_ids += seq.token_slice(start, end)
            table = seq.block_table
            for pos in range(start, end):
                positions.append(pos)
                slots.append(slot_index(table, pos, bs))
            seq_lens.append(end)
            query_lens.append(num_new)
            tables[row, :len(table)] = torch.tensor(table, dtype=torch.long)
        query_start = [0]
        for n in query_lens:
            query_start.append(query_start[-1] + n)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=tables.to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.long, device=device),
            query_start_loc=torch.tensor(query_start, dtype=torch.long, device=device),
            seq_lens_list=seq_lens,
            query_lens_list=query_lens,
            backend=self.attention_backend,
        )
        hidden = self.model(
            torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            self.kv_caches, meta,
        )
        if all_logits:
            return self.model.logits(hidden)
        last_rows = torch.tensor(query_start[1:], device=device) - 1
        return self.model.logits(hidden[last_rows])
