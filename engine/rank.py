"""What every tensor-parallel rank builds alike: its model shard, its KV pool shard and the
runner over both. Rank 0 (the engine) and the worker processes share this one path."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.config import EngineConfig
from tokenmill.engine.decode_graphs import graphs_wanted
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.kv_cache.layout import KVCacheLayout
from tokenmill.engine.kv_cache.sizing import MemoryProfile, kv_sizing
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.source import ModelSource
from tokenmill.engine.profile_run import CudaMemory, profile_memory, sample_worst_case
from tokenmill.engine.runner import ModelRunner

log = logging.getLogger(__name__)


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
    (the smallest any rank can hold), since rank 0 schedules blocks for all of them.

    On CUDA each rank profiles the worst-case step on its own shard (the ranks run it together:
    its collectives join them); rank 0 also samples its logits, as it does when serving."""
    config = setup.config
    model = build_model(model_config, setup.source, setup.max_model_len, setup.dtype, device,
                        show_progress, quantization=config.quantization, tp=tp)
    layout = KVCacheLayout.for_model(model_config, config.block_size, setup.dtype,
                                     config.kv_cache_dtype, tp.size)

    def profile() -> MemoryProfile:
        return profile_memory(model, layout, device, setup.attention_backend, CudaMemory(device),
                              max_num_batched_tokens=config.max_num_batched_tokens,
                              max_num_seqs=config.max_num_seqs,
                              max_model_len=setup.max_model_len,
                              on_logits=sample_worst_case if tp.rank == 0 else None)

    sizing = kv_sizing(config, layout.bytes_per_block, device.type, profile)
    num_blocks = tp.min_int(sizing.blocks, device)
    log.info("kv cache sizing", extra={"rank": tp.rank, **sizing.log_fields(),
                                       "rank_blocks": sizing.blocks, "blocks": num_blocks})
    runner = ModelRunner(model, num_blocks, layout, device,
                         attention_backend=setup.attention_backend)
    if graphs_wanted(device.type, setup.attention_backend, config.enforce_eager):
        runner.capture_decode_graphs(config.max_num_seqs, config.max_num_batched_tokens,
                                     setup.max_model_len)
    return runner


def rank_device(device_type: str, rank: int) -> torch.device:
    """Rank r runs on cuda:r (of the visible devices); every CPU rank on the CPU."""
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
