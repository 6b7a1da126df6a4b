"""Paged attention for the model: the Triton kernels on the GPU, the torch reference elsewhere.

The choice is made once per engine (`resolve_backend`) and rides in the step's metadata. The
kernel modules import triton, so they are imported only when the Triton backend runs.
"""

from __future__ import annotations

import os

import torch

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.kernels import triton_available
from tokenmill.engine.layers import paged_attention as reference
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.paged_attention import Scores


def resolve_backend(name: str, device: torch.device) -> str:
    """auto -> triton on CUDA when triton is installed, torch otherwise.

    Triton kernels cannot run on CPU tensors except in Triton's interpreter, so asking for them
    on CPU without TRITON_INTERPRET=1 is an error here rather than a crash mid-step.
    """
    if name == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if name == "triton":
        if not triton_available():
            raise ConfigError("attention_backend", "triton is not installed")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ConfigError("attention_backend", "Triton kernels on CPU need Triton's "
                                                   "interpreter: set TRITON_INTERPRET=1")
    return name


def check_kv_cache_dtype(kv_cache_dtype: str, backend: str, device: torch.device) -> None:
    """ConfigError where the resolved backend cannot store this KV dtype.

    The torch path dequantizes on any device. Triton converts to fp8 in hardware only from
    compute capability 8.9 (Ada, Hopper), and its CPU interpreter rounds float32 to fp8 wrongly
    near powers of two, so fp8 (e4m3 or e5m2) with the Triton backend needs such a GPU.
    """
    if not kv_cache_dtype.startswith("fp8") or backend != "triton":
        return
    if device.type != "cuda":
        raise ConfigError("kv_cache_dtype", f"{kv_cache_dtype} with the Triton attention "
                                            "backend needs a CUDA GPU; use attention_backend "
                                            "torch on CPU")
    if torch.cuda.get_device_capability(device) < (8, 9):
        raise ConfigError("kv_cache_dtype", f"{kv_cache_dtype} with the Triton attention "
                                            "backend needs a GPU of compute capability 8.9 or "
                                            "newer; use int8, or attention_backend torch")


def store_kv(k: torch.Tensor, v: torch.Tensor, cache: KVLayer, meta: AttentionMetadata) -> None:
    """Write the step's new K/V ([tokens, kv_heads, dim]) at their slots."""
    if meta.backend == "triton":
        from tokenmill.engine.kernels.kv_write import kv_write

        kv_write(k, v, cache.k, cache.v, meta.slot_mapping, cache.k_scale, cache.v_scale)
    else:
        reference.write_kv(k, v, cache.k, cache.v, meta.slot_mapping, cache.k_scale,
                           cache.v_scale)


def attention(q: torch.Tensor, cache: KVLayer, meta: AttentionMetadata,
              scale: float | Scores, sinks: torch.Tensor | None = None,
              alibi: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of every sequence's new queries ([tokens, heads, dim]) over its context
    (or its sliding window), scored as `scale` says; `sinks` ([heads]) join every softmax's
    denominator (GPT-OSS); `alibi` ([heads]): each head's slope, times how far behind the
    query a key is, taken off its score (BLOOM's ALiBi).

    On Triton, an all-decode step takes the split-K decode kernel; any step with a longer chunk
    takes one launch of the prefill/extend kernel, which serves its decodes too.
    """
    scores = scale if isinstance(scale, Scores) else Scores(scale)
    if meta.backend != "triton":
        return reference.paged_attention(q, cache.k, cache.v, meta, scores, cache.k_scale,
                                         cache.v_scale, sinks, alibi)
    if max(meta.query_lens_list) == 1:
        from tokenmill.engine.kernels.decode_attention import decode_attention

        return decode_attention(q, cache.k, cache.v, meta.block_tables, meta.seq_lens,
                                meta.max_seq_len, scores.scale,
                                num_splits=meta.decode_splits, k_scale=cache.k_scale,
                                v_scale=cache.v_scale, window=scores.window,
                                softcap=scores.softcap, sinks=sinks, chunk=scores.chunk,
                                alibi=alibi)
    from tokenmill.engine.kernels.prefill_attention import prefill_attention

    return prefill_attention(q, cache.k, cache.v, meta.block_tables, meta.seq_lens,
                             meta.query_start_loc, scores.scale,
                             k_scale=cache.k_scale, v_scale=cache.v_scale,
                             zero_unowned=meta.unowned_rows, window=scores.window,
                             softcap=scores.softcap, sinks=sinks,
                             visible_until=meta.visible_until, chunk=scores.chunk,
                             alibi=alibi)
