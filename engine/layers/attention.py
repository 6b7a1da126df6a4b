"""Paged attention for the model: the Triton kernels on the GPU, the torch reference elsewhere.

The choice is made once per engine (`resolve_backend`) and rides in the step's metadata. The
kernel modules import triton, so they are imported only when the Triton backend runs.
"""

from __future__ import annotations

import os

import torch

from tokenmill.engine.config import ConfigError
from tokenmill.engine.kernels import triton_available
from tokenmill.engine.layers import paged_attention as reference
from tokenmill.engine.layers.attention_metadata import AttentionMetadata


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


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             meta: AttentionMetadata) -> None:
    """Write the step's new K/V ([tokens, kv_heads, dim]) at their slots."""
    if meta.backend == "triton":
        from tokenmill.engine.kernels.kv_write import kv_write

        kv_write(k, v, k_cache, v_cache, meta.slot_mapping)
    else:
        reference.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of every sequence's new queries ([tokens, heads, dim]) over its context.

    On Triton, an all-decode step takes the split-K decode kernel; any step with a longer chunk
    takes one launch of the prefill/extend kernel, which serves its decodes too.
    """
    if meta.backend != "triton":
        return reference.paged_attention(q, k_cache, v_cache, meta, scale)
    if max(meta.query_lens_list) == 1:
        from tokenmill.engine.kernels.decode_attention import decode_attention

        return decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                max(meta.seq_lens_list), scale)
    from tokenmill.engine.kernels.prefill_attention import prefill_attention

    return prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                             meta.query_start_loc, max(meta.query_lens_list), scale)
