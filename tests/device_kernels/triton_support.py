"""Shared set-up of the Triton kernel tests: interpreter mode without a GPU, random paged batches.

Importing this module before the kernels matters: TRITON_INTERPRET is read when a kernel is
defined, and without a GPU the kernels must run in Triton's CPU interpreter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.kv_quant import is_quantized
from tokenmill.engine.layers.paged_attention import write_kv

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")


def _device_functions_called_without_repatching() -> None:
    """Triton's interpreter patches the language modules a kernel sees for each launch, and
    again at every call of a @triton.jit helper inside it (once per program: most of a small
    kernel's interpreted time), though the launch's patch already covers the helper's modules
    where they are the same (`tl`); the helper is then called as it is. A helper seeing a
    module not patched yet (Triton's own `tl.zeros` sees `tl.core`) is patched as before.
    Left as it is where the interpreter lacks these names."""
    import triton.language as tl
    from triton.runtime import interpreter

    device_function = getattr(interpreter, "InterpretedFunction", None)
    if not all(hasattr(x, name) for x, name in ((device_function, "rewrite"),
                                                 (interpreter, "InterpreterError"),
                                                 (tl.core, "is_builtin"))):
        return
    original = device_function.__call__

    def patched(fn) -> bool:  # a patched module's builtins are the interpreter's wrappers
        return all(not tl.core.is_builtin(module.load) for module in (tl, tl.core)
                   if any(value is module for value in fn.__globals__.values()))

    def call(self, *args, **kwargs):
        if not patched(self.fn):
            return original(self, *args, **kwargs)
        rewritten = self.rewrite()
        try:
            return rewritten(*args, **kwargs)
        except Exception as exc:
            raise interpreter.InterpreterError(repr(exc)) from exc

    device_function.__call__ = call


if os.environ.get("TRITON_INTERPRET") == "1":
    _device_functions_called_without_repatching()

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="real-size kernel runs need a CUDA GPU")
# fp8 stores and fp8 tensor cores (Ada, Hopper and newer).
FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
# The KV pool of each engine a test builds. On a GPU the default pool takes what
# gpu_memory_utilization leaves, and a second engine in the same test would find no room.
KV_CACHE_MEMORY = 64 << 20


@dataclass
class PagedBatch:
    """One step's batch: queries and new K/V, caches holding every cached prefix (with their
    scales when quantized), metadata."""

    q: torch.Tensor
    new_k: torch.Tensor
    new_v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def layer(self) -> KVLayer:
        return KVLayer(self.k_cache, self.v_cache, self.k_scale, self.v_scale)


def paged_batch(shapes: list[tuple[int, int]], heads: int, kv_heads: int, dim: int,
                block_size: int, dtype: torch.dtype = torch.float32,
                device: torch.device = DEVICE, seed: int = 0,
                kv_dtype: torch.dtype | None = None) -> PagedBatch:
    """shapes: (cached tokens, new tokens) per sequence. Blocks are shuffled over the pool and
    the new tokens' K/V are not yet in the cache. kv_dtype (default: dtype) is the caches'
    storage; int8 and fp8 caches get scales and are filled by the torch quantizer."""
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-(c + n) // block_size) for c, n in shapes]
    num_blocks = sum(blocks_needed) + 3
    free = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, dim, dtype=kv_dtype or dtype,
                          device=device)
    v_cache = torch.zeros_like(k_cache)
    scales = None, None
    if is_quantized(k_cache.dtype):
        scales = tuple(torch.zeros(k_cache.shape[:-1], device=device) for _ in range(2))
    tables, slots, starts = [], [], [0]
    new_k, new_v = [], []
    for (cached, new), count in zip(shapes, blocks_needed, strict=True):
        table = [free.pop() for _ in range(count)]
        tables.append(table)
        seq_slots = [table[p // block_size] * block_size + p % block_size
                     for p in range(cached + new)]
        k = torch.randn(cached + new, kv_heads, dim, generator=gen).to(device, dtype)
        v = torch.randn(cached + new, kv_heads, dim, generator=gen).to(device, dtype)
        write_kv(k[:cached], v[:cached], k_cache, v_cache,
                 torch.tensor(seq_slots[:cached], dtype=torch.long, device=device), *scales)
        new_k.append(k[cached:])
        new_v.append(v[cached:])
        slots += seq_slots[cached:]
        starts.append(starts[-1] + new)
    width = max(blocks_needed)
    seq_lens = [c + n for c, n in shapes]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device),
        seq_lens=torch.tensor(seq_lens, device=device),
        query_start_loc=torch.tensor(starts, device=device),
        seq_lens_list=seq_lens,
        query_lens_list=[n for _, n in shapes],
    )
    q = torch.randn(starts[-1], heads, dim, generator=gen).to(device, dtype)
    return PagedBatch(q, torch.cat(new_k), torch.cat(new_v), k_cache, v_cache, meta, *scales)
