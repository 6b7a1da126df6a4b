"""What every tensor-parallel rank builds alike: its model shard, its KV pool shard and the
runner over both. Rank 0 (the engine) and the worker processes share this one path."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.contract.model_shape import (
    latent_attention_of,
    linear_attention_layers,
    recurrent_shape_of,
)
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.execution.decode_graphs import graphs_wanted
from tokenmill.engine.execution.kv_layout import KVCacheLayout
from tokenmill.engine.execution.kv_sizing import MemoryProfile, host_tier_blocks, kv_sizing
from tokenmill.engine.execution.lora_slots import LoRASlots
from tokenmill.engine.execution.profile_run import CudaMemory, profile_memory
from tokenmill.engine.execution.recurrent_states import (
    checkpoint_slots,
    ssm_dtype,
    state_pool_bytes,
)
from tokenmill.engine.execution.runner import ModelRunner
from tokenmill.engine.execution.startup_phases import StartupPhases
from tokenmill.engine.models.architecture import encoder_of, moe_shape_of
from tokenmill.engine.models.images import batches_images, build_image_encoder, encode_images
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.source import ModelSource

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
    pooling: bool = False  # the embedding runner: no LM head of its own, no decode steps
    # A classifier's head made of these tokens' LM-head rows (vLLM's classifier_from_token).
    head_token_ids: tuple[int, ...] = ()
    images: bool = False  # the checkpoint reads images: rank 0 builds its image encoder


def build_runner(setup: RankSetup, model_config: Any, device: torch.device, tp: TPGroup,
                 show_progress: bool,
                 on_logits: Callable[[torch.Tensor], object] | None = None,
                 extra_bytes_per_block: int = 0,
                 largest_images: Callable[[], tuple[list[torch.Tensor], list[Any]]] | None = None
                 ) -> ModelRunner:
    """Load this rank's shard and size its KV pool; every rank agrees on the block count
    (the smallest any rank can hold), since rank 0 schedules blocks for all of them. The
    runner's `startup_seconds` says what each phase took on this rank.

    On CUDA each rank profiles the worst-case step on its own shard (the ranks run it together:
    its collectives join them); rank 0 passes `on_logits`, its sampler's worst case over the
    step's logits, as it samples them when serving.

    `extra_bytes_per_block` is what another pool of as many blocks takes per block on this
    rank (a speculative draft's, rank 0): the budget is shared so that both fit.
    `largest_images` (rank 0 of a model that reads images): the pixels and sizes of the
    largest batch of images one step encodes, which the profile encodes too (asked for only
    where a profile runs)."""
    config = setup.config
    phases = StartupPhases(device)
    with phases.phase("weights"):
        model = build_model(model_config, setup.source, setup.max_model_len, setup.dtype,
                            device, show_progress, quantization=config.quantization, tp=tp,
                            pooling=setup.pooling, head_token_ids=setup.head_token_ids)
        # Before the profiled step: on CUDA the slot pools count as weights.
        lora = LoRASlots(model, config.max_loras, config.max_lora_rank,
                         config.cpu_lora_capacity, setup.attention_backend) \
            if config.enable_lora else None
        image_encoder = build_image_encoder(model_config, setup.source, setup.dtype, device) \
            if setup.images and tp.rank == 0 else None
    if encoder_of(model_config) is not None:
        return _encoder_runner(setup, model, device, phases)
    layout = KVCacheLayout.for_model(model_config, config.block_size, setup.dtype,
                                     config.kv_cache_dtype, tp.size)

    def encode_largest() -> None:
        pixels, sizes = largest_images()
        if not batches_images(image_encoder):  # one at a time: one shows the peak
            pixels, sizes = pixels[:1], sizes[:1]
        with torch.inference_mode():
            encode_images(image_encoder, [p.to(device) for p in pixels], sizes)

    def profile() -> MemoryProfile:
        return profile_memory(model, layout, device, setup.attention_backend, CudaMemory(device),
                              max_num_batched_tokens=config.max_num_batched_tokens,
                              max_num_seqs=config.max_num_seqs,
                              max_model_len=setup.max_model_len,
                              on_logits=on_logits,
                              on_images=encode_largest if image_encoder is not None
                              and largest_images is not None else None,
                              state_dtype=ssm_dtype(config.mamba_ssm_cache_dtype),
                              state_slots=_state_slots(config))

    with phases.phase("kv_profile"):
        sizing = kv_sizing(config, layout.bytes_per_block + extra_bytes_per_block, device.type,
                           profile, _state_bytes(model_config, config, setup.dtype, tp.size),
                           setup.max_model_len)
        num_blocks = tp.min_int(sizing.blocks, device)
        host_blocks = tp.min_int(host_tier_blocks(config, layout.bytes_per_block, tp.size),
                                 device)
    log.info("kv cache sizing", extra={"rank": tp.rank, **sizing.log_fields(),
                                       "rank_blocks": sizing.blocks, "blocks": num_blocks,
                                       "host_blocks": host_blocks})
    with phases.phase("kv_allocate"):
        runner = ModelRunner(model, num_blocks, layout, device,
                             attention_backend=setup.attention_backend,
                             num_host_blocks=host_blocks, lora=lora,
                             state_slots=_state_slots(config),
                             state_dtype=ssm_dtype(config.mamba_ssm_cache_dtype))
        runner.image_encoder = image_encoder
        runner.weights_source = setup.source
    phases.seconds["graph_capture"] = 0.0
    latent = latent_attention_of(model_config)
    if graphs_wanted(device.type, setup.attention_backend, config.enforce_eager,
                     moe_shape_of(model_config) is not None,
                     latent is not None and latent.index_dim > 0) and not setup.pooling:
        with phases.phase("graph_capture"):
            runner.capture_decode_graphs(config.max_num_seqs, config.max_num_batched_tokens,
                                         setup.max_model_len,
                                         *verify_graph_shape(config, device.type),
                                         sizes=config.cuda_graph_sizes)
    runner.startup_seconds = phases.seconds
    return runner


def _state_bytes(model_config: Any, config: EngineConfig, dtype: torch.dtype,
                 tp_size: int) -> int:
    """What this rank's recurrent states take (0 for a model without them)."""
    shape = recurrent_shape_of(model_config)
    if shape is None:
        return 0
    return state_pool_bytes(shape.sharded(tp_size), len(linear_attention_layers(model_config)),
                            _state_slots(config), dtype, ssm_dtype(config.mamba_ssm_cache_dtype))


def _state_slots(config: EngineConfig) -> int:
    """Recurrent-state slots: one per sequence, and the prefix cache's checkpoints."""
    return config.max_num_seqs + checkpoint_slots(
        config.max_num_seqs, config.enable_prefix_caching, config.mamba_cache_mode)


def _encoder_runner(setup: RankSetup, model: Any, device: torch.device,
                    phases: StartupPhases) -> ModelRunner:
    """An encoder keeps no KV cache: its pool has no layers and takes no memory, and its
    blocks only count what the scheduler admits (every running prompt whole)."""
    config = setup.config
    layout = KVCacheLayout(0, 1, 1, config.block_size, setup.dtype)
    num_blocks = config.max_num_seqs * -(-setup.max_model_len // config.block_size)
    runner = ModelRunner(model, num_blocks, layout, device,
                         attention_backend=setup.attention_backend)
    phases.seconds.update(kv_profile=0.0, kv_allocate=0.0, graph_capture=0.0)
    runner.startup_seconds = phases.seconds
    return runner


def verify_graph_shape(config: EngineConfig, device_type: str = "cuda") -> tuple[int, int]:
    """(query length, most sequences) of the speculative verify steps to capture graphs for:
    K+1 tokens, while fewer sequences run than turn speculation off; (0, 0) without
    speculation."""
    speculative = config.speculative()
    if speculative is None:
        return 0, 0
    speculative = speculative.on_device(device_type)
    most = config.max_num_seqs
    if speculative.disable_by_batch_size:
        most = min(most, speculative.disable_by_batch_size - 1)
    return (speculative.num_speculative_tokens + 1, most) if most >= 1 else (0, 0)


def rank_device(device_type: str, rank: int) -> torch.device:
    """Rank r runs on cuda:r (of the visible devices); every CPU rank on the CPU."""
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
