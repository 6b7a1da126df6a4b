"""DeepSeek-V2/V3's multi-head latent attention over the paged KV cache.

The cache keeps one row per token and layer: the normalized latent (kv_lora_rank wide) and
the rotated key part shared by every head (rope_dim wide). Attention runs on that row as one
KV head read by all query heads ("absorbed" form): each head's query is carried into the
latent's space through its slice of kv_b_proj's key half, and the output read back out through
the value half. q·k and the values equal those of expanding every head's key and value as
transformers does; the cache holds kv_lora_rank + rope_dim numbers per token instead of
heads * (qk_dim + value_dim), and the existing paged kernels run it unchanged.

DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) adds an indexer (models/dsa_indexer.py)
whose key rides in the same row, past the rotary key, where the dense path's query holds
zeros. Where a context is longer than index_topk, each query attends to the positions the
indexer chose only (layers/sparse_attention.py); shorter ones see every position, which is the
dense attention above.

Parameter names equal Hugging Face's (q_proj or q_a_proj/q_a_layernorm/q_b_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.contract.model_shape import LatentAttention as LatentShape
from tokenmill.engine.contract.model_shape import latent_attention_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.layers.attention import Scores, attention, store_kv
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.norm import RMSNorm
from tokenmill.engine.layers.rotary import (
    RopeKernel,
    RopeRows,
    ScaledQueries,
    rope_parameters,
    yarn_mscale,
)
from tokenmill.engine.layers.sparse_attention import (
    IndexQueries,
    attend_chosen,
    select,
    sparse_sequences,
)
from tokenmill.engine.models.architecture import flags_of
from tokenmill.engine.models.dsa_indexer import Indexer

# transformers builds the latent's norms with RMSNorm's default epsilon, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class LatentProjection(nn.Module):
    """kv_b_proj: the latent to each head's key (no rotary part) and value, [heads *
    (nope_dim + value_dim), kv_lora_rank]. Not an nn.Linear: attention reads its halves as
    matrices, so quantization passes it by."""

    def __init__(self, latent: LatentShape, num_heads: int):
        super().__init__()
        self.nope_dim, self.value_dim = latent.nope_dim, latent.value_dim
        self.weight = nn.Parameter(torch.empty(num_heads * (latent.nope_dim + latent.value_dim),
                                               latent.kv_lora_rank))

    def halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key [heads, nope_dim, rank], value [heads, value_dim, rank])."""
        per_head = self.weight.view(-1, self.nope_dim + self.value_dim, self.weight.shape[-1])
        return per_head[:, :self.nope_dim], per_head[:, self.nope_dim:]


def softmax_scale(config: Any, qk_dim: int) -> float:
    """qk_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared where the rotary
    embedding is stretched (DeepSeek's long-context checkpoints), as transformers scales it."""
    scale = qk_dim ** -0.5
    params = rope_parameters(config)
    all_dim = params.get("mscale_all_dim")
    if params["rope_type"] != "default" and all_dim:
        scale *= yarn_mscale(float(params.get("factor") or 1.0), all_dim) ** 2
    return scale


class LatentSelfAttention(nn.Module):
    """This rank's heads of a latent-attention layer; the latent and its cache are whole on
    every rank, and o_proj's partial sums are added across ranks. `indexer`: "full", its own
    sparse-attention indexer; "shared", the positions the last full layer's chose (GLM-5);
    None: dense attention."""

    def __init__(self, config: Any, plan: ShardPlan, tp: TPGroup, indexer: str | None = None):
        super().__init__()
        latent = latent_attention_of(config)
        self.latent = latent
        self.tp = tp
        self.num_heads = plan.num_heads
        hidden = config.hidden_size
        bias = bool(getattr(config, "attention_bias", False))
        if latent.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, self.num_heads * latent.qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, latent.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(latent.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(latent.q_lora_rank, self.num_heads * latent.qk_dim,
                                      bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, latent.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(latent.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = LatentProjection(latent, self.num_heads)
        self.o_proj = nn.Linear(self.num_heads * latent.value_dim, hidden, bias=bias)
        self.scores = Scores(softmax_scale(config, latent.qk_dim))
        # DeepSeek-V2 always, and V3 with rope_interleave, rotate adjacent pairs (2i, 2i+1).
        self.interleaved = bool(getattr(config, "rope_interleave", True))
        self.sparse = indexer is not None
        self.index_topk = int(config.index_topk) if self.sparse else 0
        self.indexer = Indexer(config, flags_of(config).indexer_rope_interleaved) \
            if indexer == "full" else None

    def forward(self, x: torch.Tensor, rope: RopeRows | RopeKernel | ScaledQueries | None,
                kv_cache: KVLayer, meta: AttentionMetadata) -> torch.Tensor:
        latent, tokens = self.latent, x.shape[0]
        if latent.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q_residual = self.q_a_layernorm(self.q_a_proj(x), backend=meta.backend)[0]
            q = self.q_b_proj(q_residual)
        q = q.view(tokens, self.num_heads, latent.qk_dim)
        q_nope, q_rot = q.split([latent.nope_dim, latent.rope_dim], dim=-1)
        compressed = self.kv_a_proj_with_mqa(x)
        kv, k_rot = compressed.split([latent.kv_lora_rank, latent.rope_dim], dim=-1)
        kv = self.kv_a_layernorm(kv.contiguous(), backend=meta.backend)[0]
        q_rot, k_rot = self._halves(q_rot), self._halves(k_rot.reshape(tokens, 1, -1))
        # Mistral 4 scales the whole query (both parts) by position; the latent part's scale
        # carries through its projection.
        scale = rope.scale if isinstance(rope, ScaledQueries) else None
        if scale is not None:
            rope = rope.rope
        if rope is not None:  # None: Kimi Linear's, without positional encoding
            q_rot, k_rot = rope.rotate(q_rot, k_rot)
        key_half, value_half = self.kv_b_proj.halves()
        # Each head's query in the latent's space: q_nope · (W_k c) == (q_nope W_k) · c.
        q_latent = torch.einsum("thn,hnr->thr", q_nope, key_half)
        query = torch.cat([q_latent, q_rot], dim=-1)
        if scale is not None:
            query = query * scale
        parts, index = [kv, k_rot.reshape(tokens, -1)], None
        if self.indexer is not None:
            index, index_key = self.indexer(x, q_residual, rope)
            parts.append(index_key.to(kv.dtype))
        elif self.sparse:  # a shared layer's row: zeros where a full layer's has its key
            parts.append(kv.new_zeros(tokens, latent.index_dim))
        row = torch.cat(parts, dim=-1).unsqueeze(1)
        store_kv(row, row, kv_cache, meta)
        if self.sparse:
            o = self._sparse_attention(query, index, kv_cache, meta)
        else:
            o = attention(query, kv_cache, meta, self.scores)
        out = torch.einsum("thr,hvr->thv", o[..., :latent.kv_lora_rank], value_half)
        return self.tp.all_reduce(self.o_proj(out.reshape(tokens, -1)))

    def _sparse_attention(self, query: torch.Tensor, index: IndexQueries | None,
                          kv_cache: KVLayer, meta: AttentionMetadata) -> torch.Tensor:
        """Dense attention (the kernels') for contexts no longer than index_topk, the chosen
        positions for longer ones: this layer's indexer's choice, or on a shared layer the
        choice the last full layer made in this step."""
        longer = sparse_sequences(meta, self.index_topk)
        if index is not None and longer:
            meta.step_cache["dsa_chosen"] = select(index, kv_cache, meta,
                                                   self.latent.latent_dim, self.index_topk)
        if len(longer) < meta.num_seqs:
            # The query reads the row's indexer key as zeros.
            padded = F.pad(query, (0, self.latent.index_dim))
            out = attention(padded, kv_cache, meta, self.scores)[..., :query.shape[-1]]
        else:
            out = torch.empty_like(query)
        if longer:
            attend_chosen(query, kv_cache, meta, meta.step_cache["dsa_chosen"],
                          self.scores.scale, out)
        return out

    def _halves(self, x: torch.Tensor) -> torch.Tensor:
        """Interleaved rotary pairs (2i, 2i+1) laid out as the two halves the engine's rotary
        turns (a new tensor either way: the Triton rotary works in place)."""
        if not self.interleaved:
            return x.contiguous()
        return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
