"""Model runner: owns the model and the KV pool tensors, turns a scheduled step into logits."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.engine.kv_cache.manager import slot_index
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.models.decoder import CausalLM, head_dim_of, num_kv_heads_of
from tokenmill.engine.request import Sequence


def kv_bytes_per_block(model_config: Any, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for block_size tokens."""
    per_token = (2 * model_config.num_hidden_layers * num_kv_heads_of(model_config)
                 * head_dim_of(model_config) * torch.tensor([], dtype=dtype).element_size())
    return per_token * block_size


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int,
                 device: torch.device, kv_dtype: torch.dtype, attention_backend: str = "torch"):
        self.model = model
        self.attention_backend = attention_backend  # "torch" or "triton", already resolved
        self.device = device
        self.block_size = block_size
        config = model.config
        shape = (config.num_hidden_layers, 2, num_blocks, block_size,
                 num_kv_heads_of(config), head_dim_of(config))
        # Zeroed, not empty: attention reads masked-out slots too (0 * NaN would be NaN).
        self.kv_pool = torch.zeros(shape, dtype=kv_dtype, device=device)
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_pool]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of shared blocks, before the step that writes into the copies."""
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Run one step; return logits for the last new token of every sequence, in order."""
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
        last_rows = torch.tensor(query_start[1:], device=device) - 1
        return self.model.logits(hidden[last_rows])
