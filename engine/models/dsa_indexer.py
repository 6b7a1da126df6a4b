"""The lightning indexer of DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): small heads that
score each query against every cached position, so the latent attention reads only the best
`index_topk` (layers/sparse_attention.py).

Parameter names equal Hugging Face's (indexer.wq_b, indexer.wk, indexer.k_norm,
indexer.weights_proj). Whole on every rank: each rank chooses the same positions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.engine.layers.norm import LayerNorm
from tokenmill.engine.layers.rotary import RopeKernel, RopeRows
from tokenmill.engine.layers.sparse_attention import IndexQueries

# transformers builds the indexer's key norm with this epsilon, whatever the config's.
KEY_NORM_EPS = 1e-6


def indexer_kinds(config: Any) -> list[str | None]:
    """Each layer's indexer: "full" (its own), "shared" (GLM-5's: the last full layer's
    choice, indexer_types), None where the model has no sparse attention."""
    if not getattr(config, "index_topk", None):
        return [None] * config.num_hidden_layers
    return list(getattr(config, "indexer_types", None) or ["full"] * config.num_hidden_layers)


class HeadWeights(nn.Module):
    """weights_proj: a weight per indexer head from the hidden state, computed in float32 as
    transformers keeps it. Not an nn.Linear, so quantization passes it by."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x.float(), self.weight.float().t())


class Indexer(nn.Module):
    """Queries from the latent query's low-rank residual (q_a_layernorm's output), one key per
    token from the hidden state (normalized), a weight per head and query. The rotary turn
    covers each head's first rope_dim numbers: over two halves (DeepSeek-V3.2) or adjacent
    pairs (`interleaved`, GLM-5), with the latent attention's tables."""

    def __init__(self, config: Any, interleaved: bool):
        super().__init__()
        self.num_heads = int(config.index_n_heads)
        self.head_dim = int(config.index_head_dim)
        self.rope_dim = int(config.qk_rope_head_dim)
        self.interleaved = interleaved
        self.wq_b = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.k_norm = LayerNorm(self.head_dim, KEY_NORM_EPS)
        self.weights_proj = HeadWeights(config.hidden_size, self.num_heads)
        self.weight_scale = (self.num_heads ** -0.5) * (self.head_dim ** -0.5)

    def forward(self, x: torch.Tensor, q_residual: torch.Tensor,
                rope: RopeRows | RopeKernel) -> tuple[IndexQueries, torch.Tensor]:
        """(the step's index queries, each token's key [tokens, head_dim] to cache)."""
        tokens = x.shape[0]
        q = self._pairs_as_halves(self.wq_b(q_residual).view(tokens, self.num_heads, -1))
        k = self._pairs_as_halves(self.k_norm(self.wk(x))[0].view(tokens, 1, -1))
        q, k = rope.rotate(q, k)
        # q . k's softmax scale moves into the weights, through the ReLU.
        weights = self.weights_proj(x) * self.weight_scale
        return IndexQueries(q, weights), k.reshape(tokens, -1)

    def _pairs_as_halves(self, x: torch.Tensor) -> torch.Tensor:
        """Adjacent rotary pairs (2i, 2i+1) laid out as two halves, as the engine's rotary
        turns them: q and k alike, so q . k is unchanged. A new tensor either way (the Triton
        rotary turns in place)."""
        rot, rest = x[..., :self.rope_dim], x[..., self.rope_dim:]
        if self.interleaved:
            rot = torch.cat([rot[..., 0::2], rot[..., 1::2]], dim=-1)
        return torch.cat([rot, rest], dim=-1)
