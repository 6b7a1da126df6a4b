"""How many KV blocks one device's pool holds: from --kv-cache-memory, or on CUDA from the
memory left under --gpu-memory-utilization once the weights are loaded."""

from __future__ import annotations

import torch

from tokenmill.engine.config import DEFAULT_CPU_KV_CACHE_MEMORY, ConfigError, EngineConfig
from tokenmill.engine.kv_cache.layout import KVCacheLayout


def kv_blocks(config: EngineConfig, layout: KVCacheLayout, device: torch.device) -> int:
    per_block = layout.bytes_per_block  # a quantized KV dtype's scales included
    budget = config.kv_cache_memory
    if budget is None:
        budget = (_cuda_kv_budget(config, device) if device.type == "cuda"
                  else DEFAULT_CPU_KV_CACHE_MEMORY)
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ConfigError("kv_cache_memory", f"{budget} bytes hold no KV block; one block "
                                             f"of this model takes {per_block} bytes")
    return int(num_blocks)


def _cuda_kv_budget(config: EngineConfig, device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    # Headroom for activations and logits of the largest step.
    reserve = config.max_num_batched_tokens * 64 * 1024 + (256 << 20)
    budget = int(total * config.gpu_memory_utilization) - used - reserve
    if budget <= 0:
        raise ConfigError("gpu_memory_utilization",
                          f"{config.gpu_memory_utilization} leaves no memory for the KV cache")
    return budget
