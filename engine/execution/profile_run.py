"""The profiling step that sizes the KV pool on CUDA (vLLM's method): run the largest step the
scheduler can ever build through the real runner, over a small temporary pool, and read the
allocator's peak. What the weights and activations take is then measured, not guessed. Rank 0
passes its sampler's worst case as `on_logits` (core/sampler.py), so it joins the peak.

Allocator reads go through a MemoryProbe, so the step itself runs on any device (tests run it on
CPU with a probe of known figures); CudaMemory reads torch's CUDA allocator."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.contract.model_shape import linear_attention_layers
from tokenmill.engine.execution.kv_layout import KVCacheLayout
from tokenmill.engine.execution.kv_sizing import MemoryProfile
from tokenmill.engine.execution.runner import ModelRunner
from tokenmill.engine.execution.step_inputs import StepInputs
from tokenmill.engine.models.decoder import CausalLM


@dataclass(frozen=True)
class MemoryReading:
    total: int      # device memory
    free: int       # device memory nobody holds (any process, any allocator)
    allocated: int  # held by torch's tensors now
    peak: int       # most held by torch's tensors since the last reset
    reserved: int   # held by torch's caching allocator (tensors plus its cache)


class MemoryProbe(Protocol):
    def reset(self) -> None:
        """Give cached, unused memory back to the device and restart the peak."""

    def read(self) -> MemoryReading:
        """The figures once the device has finished its queued work."""


class CudaMemory:
    """MemoryProbe over torch's CUDA caching allocator."""

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        gc.collect()  # tensors held only by reference cycles must go before the cache is emptied
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> MemoryReading:
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return MemoryReading(total, free, torch.cuda.memory_allocated(self.device),
                             torch.cuda.max_memory_allocated(self.device),
                             torch.cuda.memory_reserved(self.device))


def worst_case_step(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                    block_size: int) -> tuple[StepInputs, int]:
    """The largest step the scheduler can build, and the KV blocks it writes.

    Every sequence it may hold (max_num_seqs rows of logits for the sampler), the whole token
    budget through the linear layers, and prompts as long as max_model_len allows (attention's
    largest). The one-token rows are decodes packed one slot each into shared blocks, so the
    temporary pool stays near max_num_batched_tokens / block_size blocks.
    """
    num_seqs = min(max_num_seqs, max_num_batched_tokens)
    lengths = [1] * num_seqs
    extra = min(max_num_batched_tokens, num_seqs * max_model_len) - num_seqs
    for i in range(num_seqs):
        grow = min(extra, max_model_len - 1)
        lengths[i] += grow
        extra -= grow
    step = StepInputs()
    next_block = 0
    prompts = [n for n in lengths if n > 1]
    for n in prompts:
        table = list(range(next_block, next_block + -(-n // block_size)))
        next_block += len(table)
        step.add_sequence([0] * n, 0, table, block_size)
    per_block = min(block_size, max_model_len)  # a decode's position stays under max_model_len
    num_decodes = num_seqs - len(prompts)
    for j in range(num_decodes):
        step.add_sequence([0], j % per_block, [next_block + j // per_block], block_size)
    return step, next_block + -(-num_decodes // per_block)


def profile_memory(model: CausalLM, layout: KVCacheLayout, device: torch.device,
                   attention_backend: str, memory: MemoryProbe, *, max_num_batched_tokens: int,
                   max_num_seqs: int, max_model_len: int,
                   on_logits: Callable[[torch.Tensor], object] | None = None,
                   on_images: Callable[[], object] | None = None,
                   state_dtype: torch.dtype = torch.float32,
                   state_slots: int | None = None) -> MemoryProfile:
    """Run the worst-case step on the loaded model over a temporary pool and measure it;
    `on_images` (rank 0 of a model that reads images) encodes the largest batch of images
    one step may, its activations joining the peak.

    A model with linear-attention layers also holds its recurrent states (in `state_dtype`)
    in the step, `state_slots` of them (default max_num_seqs: one per sequence; the engine
    adds the prefix cache's checkpoints): they join the peak, as the real pool's will take
    that room.

    The temporary pool is freed (and the allocator's cache emptied) before this returns, so
    the real pool is allocated into memory nothing else holds. The model is only read.
    """
    step, num_blocks = worst_case_step(max_num_batched_tokens, max_num_seqs, max_model_len,
                                       layout.block_size)
    memory.reset()
    weights = memory.read().allocated
    try:
        if on_images is not None:
            on_images()  # its rows are let go before the step: only its peak stays
        runner = ModelRunner(model, num_blocks, layout, device,
                             attention_backend=attention_backend,
                             state_slots=max_num_seqs if state_slots is None else state_slots,
                             state_dtype=state_dtype)
        logits = runner.run(step)
        if on_logits is not None:
            on_logits(logits)
        after = memory.read()
    except torch.OutOfMemoryError as exc:
        states = " and the recurrent states of as many sequences (or keep them in 16 bits: " \
            "mamba_ssm_cache_dtype bfloat16)" if linear_attention_layers(model.config) else ""
        raise ConfigError(
            "max_num_batched_tokens",
            f"the largest step ({max_num_batched_tokens} tokens, {max_num_seqs} sequences"
            f"{states}) ran out of device memory next to the weights: lower "
            f"max_num_batched_tokens or max_num_seqs ({exc})") from None
    del runner, logits
    memory.reset()
    pool = num_blocks * layout.bytes_per_block
    return MemoryProfile(total=after.total, weights=weights, peak=after.peak - pool,
                         non_torch=after.total - after.free - after.reserved)
