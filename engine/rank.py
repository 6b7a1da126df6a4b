"""What every tensor-parallel rank builds alike: its model shard, its KV pool shard and the
runner over both. Rank 0 (the engine) and the worker processes share this one path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.config import EngineConfig
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.kv_cache.layout import KVCacheLayout
from tokenmill.engine.kv_cache.sizing import kv_blocks
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.source import ModelSource
from tokenmill.engine.runner import ModelRunner


@dataclass(frozen=True)
class RankSetup:
    """Everything resolved that a rank needs; rank 0 sends it to the workers (pickled)."""

    config: EngineConfig
    source: ModelSource
    device_type: str  # "cpu" or "cuda": rank r runs on cuda:r
    dtype: torch.dtype
    attention_backend: str
    max_model_len: int


def build_runner(setup: RankSetup, model_config: Any, device: torch.device, tp: TPGroup,
                 show_progress: bool) -> ModelRunner:
    """Load this rank's shard and size its KV pool; every rank agrees on the block count
    (the smallest any rank can hold), since rank 0 schedules blocks for all of them."""
    config = setup.config
    model = build_model(model_config, setup.source, setup.max_model_len, setup.dtype, device,
                        show_progress, quantization=config.quantization, tp=tp)
    layout = KVCacheLayout.for_model(model_config, config.block_size, setup.dtype,
                                     config.kv_cache_dtype, tp.size)
    num_blocks = tp.min_int(kv_blocks(config, layout, device), device)
    return ModelRunner(model, num_blocks, layout, device, attention_backend=setup.attention_backend)


def rank_device(device_type: str, rank: int) -> torch.device:
    """Rank r runs on cuda:r (of the visible devices); every CPU rank on the CPU."""
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
