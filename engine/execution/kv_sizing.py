"""How many KV blocks one device's pool holds: --num-gpu-blocks-override or --kv-cache-memory
when given, 1 GiB on CPU, and on CUDA what --gpu-memory-utilization leaves once a profiled
worst-case step has shown what the weights, activations and memory outside torch's allocator
take (engine/execution/profile_run.py).

The arithmetic is plain numbers in, numbers out, so it is tested on known figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenmill.engine.contract.config import DEFAULT_CPU_KV_CACHE_MEMORY, ConfigError, EngineConfig

GIB = 1 << 30

# Held back for what is allocated after the pool and so cannot be profiled before it: the
# decode CUDA graphs' private memory pool (activations of the largest graphed decode batch,
# split-K attention partials that grow with max_model_len) and their cuBLAS workspaces.
# vLLM measures a few hundred MiB for such graphs on 8B-class models.
CUDA_GRAPH_MARGIN = 512 << 20


@dataclass(frozen=True)
class MemoryProfile:
    """One device's memory, measured around the worst-case step (bytes)."""

    total: int      # the device's memory
    weights: int    # held by torch before the step: the model's weights
    peak: int       # torch's peak during the step, weights included, temporary KV pool not
    non_torch: int  # in use outside torch's allocator: CUDA context, NCCL, other processes

    @property
    def activation(self) -> int:
        return self.peak - self.weights


def kv_budget(profile: MemoryProfile, utilization: float, margin: int = CUDA_GRAPH_MARGIN) -> int:
    """Bytes left for the KV pool under `utilization` of the device (negative: none)."""
    return int(profile.total * utilization) - profile.peak - profile.non_torch - margin


def profiled_blocks(profile: MemoryProfile, utilization: float, bytes_per_block: int,
                    state_bytes: int = 0) -> int:
    """Whole blocks in the budget; ConfigError naming gpu_memory_utilization when none fits,
    or max_num_seqs where the recurrent states held for that many sequences (`state_bytes`,
    counted in the peak: Qwen3.5's, Granite 4.0-H's) would leave room for blocks without
    them."""
    budget = kv_budget(profile, utilization)
    if budget < bytes_per_block:
        gib = 1 << 30
        if state_bytes and budget + state_bytes >= bytes_per_block:
            raise ConfigError(
                "max_num_seqs",
                f"the recurrent states of the linear-attention layers, one per sequence the "
                f"batch may hold and the prefix cache's (one per four sequences), take "
                f"{state_bytes / gib:.2f} GiB and leave no room for a KV block under "
                f"gpu_memory_utilization {utilization}; lower max_num_seqs, keep them in 16 "
                "bits (mamba_ssm_cache_dtype bfloat16), or keep none for the prefix cache "
                "(mamba_cache_mode none)")
        raise ConfigError(
            "gpu_memory_utilization",
            f"{utilization} of {profile.total / gib:.2f} GiB leaves no room for a KV block "
            f"({bytes_per_block} bytes): the weights and the largest step's activations peak "
            f"at {profile.peak / gib:.2f} GiB, memory outside torch takes "
            f"{profile.non_torch / gib:.2f} GiB and {CUDA_GRAPH_MARGIN >> 20} MiB are kept for "
            "CUDA graphs; raise gpu_memory_utilization, lower max_num_batched_tokens or "
            "max_num_seqs, or use a smaller model (or more tensor-parallel ranks)")
    return budget // bytes_per_block


@dataclass(frozen=True)
class KVSizing:
    """A pool size and where it came from, for the start-up log."""

    blocks: int
    budget: int
    profile: MemoryProfile | None = None  # None: the budget was given, not measured
    utilization: float | None = None

    source: str = "kv_cache_memory"  # the flag that gave the budget, when not profiled

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"budget_bytes": self.budget, "blocks": self.blocks}
        if self.profile is None:
            return {"source": self.source, **fields}
        p = self.profile
        return {"source": "profiled", "total_bytes": p.total,
                "gpu_memory_utilization": self.utilization, "weights_bytes": p.weights,
                "peak_activation_bytes": p.activation, "non_torch_bytes": p.non_torch,
                "cuda_graph_margin_bytes": CUDA_GRAPH_MARGIN, **fields}


def kv_sizing(config: EngineConfig, bytes_per_block: int, device_type: str,
              profile: Callable[[], MemoryProfile], state_bytes: int = 0,
              max_model_len: int = 0) -> KVSizing:
    """--num-gpu-blocks-override, then --kv-cache-memory win (nothing is profiled); CPU has no
    allocator statistics and keeps its 1 GiB default; on CUDA `profile` runs the worst-case
    step and the budget is measured. `state_bytes`: what the recurrent states of a
    linear-attention model take (in the profile's peak), for the refusal's reason.

    An attention-free model (Mamba-2's: `bytes_per_block` 0) keeps nothing in its blocks: they
    are the scheduler's count of tokens only, as many as max_num_seqs sequences of
    `max_model_len` twice over (the second for the prefix cache); on CUDA the profile still
    checks that the states fit."""
    if config.num_gpu_blocks_override is not None:
        blocks = config.num_gpu_blocks_override
        return KVSizing(blocks, blocks * bytes_per_block, source="num_gpu_blocks_override")
    if bytes_per_block == 0:
        if config.kv_cache_memory is None and device_type == "cuda":
            _check_states_fit(profile(), config.gpu_memory_utilization, state_bytes)
        blocks = 2 * config.max_num_seqs * -(-max_model_len // config.block_size)
        return KVSizing(max(blocks, 1), 0, source="attention_free")
    if config.kv_cache_memory is None and device_type == "cuda":
        measured = profile()
        blocks = profiled_blocks(measured, config.gpu_memory_utilization, bytes_per_block,
                                 state_bytes)
        return KVSizing(blocks, kv_budget(measured, config.gpu_memory_utilization), measured,
                        config.gpu_memory_utilization)
    budget = config.kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY
    if budget < bytes_per_block:
        raise ConfigError("kv_cache_memory", f"{budget} bytes hold no KV block; one block "
                                             f"of this model takes {bytes_per_block} bytes")
    return KVSizing(budget // bytes_per_block, budget)


def _check_states_fit(profile: MemoryProfile, utilization: float, state_bytes: int) -> None:
    """ConfigError naming max_num_seqs where an attention-free model's weights, activations
    and states (in the profile's peak) exceed gpu_memory_utilization."""
    if kv_budget(profile, utilization) >= 0:
        return
    raise ConfigError(
        "max_num_seqs",
        f"the weights, the largest step's activations and the recurrent states (one per "
        f"sequence the batch may hold and the prefix cache's, {state_bytes / GIB:.2f} GiB) "
        f"peak at {profile.peak / GIB:.2f} GiB, over gpu_memory_utilization {utilization} of "
        f"{profile.total / GIB:.2f} GiB; lower max_num_seqs or max_num_batched_tokens, or "
        "raise gpu_memory_utilization")


def host_tier_blocks(config: EngineConfig, bytes_per_block: int, tp_size: int) -> int:
    """Blocks of one rank's host tier: --kv-offloading-size is shared by the ranks, each
    storing blocks of its own shard (bytes_per_block)."""
    if not config.kv_offloading_size:
        return 0
    if not bytes_per_block:
        raise ConfigError("kv_offloading_size", "this model keeps no keys and values (it has "
                                                "no attention layer): there is nothing to "
                                                "offload")
    per_rank = int(config.kv_offloading_size * GIB) // tp_size
    if per_rank < bytes_per_block:
        raise ConfigError("kv_offloading_size",
                          f"{config.kv_offloading_size} GiB over {tp_size} rank(s) holds no KV "
                          f"block; one block of a rank takes {bytes_per_block} bytes")
    return per_rank // bytes_per_block


def check_host_memory(config: EngineConfig, available: int | None = None) -> None:
    """Refuse a host tier larger than the host memory available now (MemAvailable), before
    anything is loaded: pinning it would fail late or push the machine into swap."""
    if not config.kv_offloading_size:
        return
    if available is None:
        available = host_memory_available()
    wanted = config.kv_offloading_size * GIB
    if available is not None and wanted > available:
        raise ConfigError("kv_offloading_size",
                          f"{config.kv_offloading_size} GiB asked for the host tier, but only "
                          f"{available / GIB:.2f} GiB of host memory is available; lower "
                          "--kv-offloading-size")


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
