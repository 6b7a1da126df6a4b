"""The speculative draft model on rank 0's device: whole (tensor parallelism 1, whatever the
target's), in the target's dtype, run eagerly over its own paged KV pool.

Its weights are loaded before the target's KV pool is sized, so on CUDA the profiled budget
already leaves them out; its pool then takes the target's number of blocks out of that same
budget (rank.py's extra_bytes_per_block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.execution.kv_layout import KVCacheLayout
from tokenmill.engine.execution.runner import ModelRunner
from tokenmill.engine.models.decoder import CausalLM
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.source import ModelSource


@dataclass
class DraftModel:
    model: CausalLM
    layout: KVCacheLayout
    device: torch.device
    attention_backend: str

    def runner(self, num_blocks: int) -> ModelRunner:
        """The draft's runner over a pool of num_blocks blocks."""
        return ModelRunner(self.model, num_blocks, self.layout, self.device,
                           attention_backend=self.attention_backend)


def load_draft_model(source: ModelSource, model_config: Any, max_model_len: int,
                     block_size: int, dtype: torch.dtype, device: torch.device,
                     attention_backend: str) -> DraftModel:
    """Load the draft's weights (one rank, no quantization) and its KV layout (the model's
    dtype: the draft's KV precision changes only how often its proposals are accepted)."""
    model = build_model(model_config, source, max_model_len, dtype, device,
                        show_progress=False, quantization="none")
    layout = KVCacheLayout.for_model(model_config, block_size, dtype)
    return DraftModel(model, layout, device, attention_backend)
