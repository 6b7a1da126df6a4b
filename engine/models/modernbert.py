"""ModernBERT (ModernBertModel, ModernBertForSequenceClassification): an encoder of pre-norm
layers without biases, rotary positions (one base for global layers, another for local ones),
local layers that see 2 x `sliding_window` + 1 positions around each token, and a GeGLU MLP.
Embedding models (gte-modernbert, modernbert-embed) and rerankers are built on it.

Like models/encoder.py's BERT, a prompt runs whole in one step and keeps no KV cache; the
parameter names are transformers' (a classifier checkpoint's `model.` prefix is dropped, its
head lands in `score`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.rotary import RotaryEmbedding, rope_parameters
from tokenmill.engine.models.encoder import ACTIVATIONS, EncoderModel, bidirectional_attention
from tokenmill.engine.models.source import ModelLoadError

LOCAL = "sliding_attention"


def _norm(config: Any) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


def check_modernbert_config(config: Any) -> None:
    """ModelLoadError for a ModernBERT config this module does not compute."""
    for name in (config.hidden_activation, getattr(config, "classifier_activation", "gelu")):
        if name not in ACTIVATIONS:
            raise ModelLoadError(f"activation {name!r} is not supported "
                                 f"({', '.join(ACTIVATIONS)})")
    pooling = getattr(config, "classifier_pooling", "cls")
    if getattr(config, "num_labels", None) and pooling != "cls":
        raise ModelLoadError(f"classifier_pooling {pooling!r} is not supported; tokenmill's "
                             "ModernBERT classifiers read the first token (cls)")


class Embeddings(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = _norm(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class Attention(nn.Module):
    def __init__(self, config: Any, local: bool):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size,
                              bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.window = int(config.sliding_window) if local else None

    def forward(self, x: torch.Tensor, rope: Any, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.Wqkv(x).view(tokens, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = rope.rotate(q, k)
        o = bidirectional_attention(q, k, v, meta, self.window)
        return self.Wo(o.reshape(tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.hidden_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(value) * gate)


class Layer(nn.Module):
    def __init__(self, config: Any, index: int):
        super().__init__()
        self.local = config.layer_types[index] == LOCAL
        self.attn_norm = nn.Identity() if index == 0 else _norm(config)
        self.attn = Attention(config, self.local)
        self.mlp_norm = _norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: Any, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, meta)
        return x + self.mlp(self.mlp_norm(x))


class Head(nn.Module):
    """The classifier's head over the first token's state: dense, activation, LayerNorm (the
    checkpoint's `head`), then one output per label (its `classifier`). In float32 on the
    pooled rows (execution/pooled_rows.py)."""

    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size,
                               bias=config.classifier_bias)
        self.norm = _norm(config)
        self.out = nn.Linear(config.hidden_size, int(config.num_labels))
        self.act = ACTIVATIONS[config.classifier_activation]

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        weights = {name: p.float() for name, p in self.named_parameters()}
        x = F.linear(pooled, weights["dense.weight"], weights.get("dense.bias"))
        x = F.layer_norm(self.act(x), (x.shape[-1],), weights["norm.weight"],
                         weights.get("norm.bias"), self.norm.eps)
        return F.linear(x, weights["out.weight"], weights["out.bias"])


class ModernBertEncoder(nn.Module):
    """Embeddings, the layers and the final norm (and a classifier's head, `score`);
    `forward` returns every token's hidden state, as EncoderModel's does."""

    def __init__(self, config: Any, classifier: bool, max_positions: int):
        super().__init__()
        check_modernbert_config(config)
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = _norm(config)
        self.score = Head(config) if classifier else None
        self.max_positions = max_positions
        # Computed, not loaded: the loader builds them (rotary_tables) on the model's device.
        self.rotary: RotaryEmbedding | None = None
        self.rotary_local: RotaryEmbedding | None = None

    def rotary_tables(self) -> tuple[RotaryEmbedding, RotaryEmbedding]:
        """The global layers' rotary table and the local layers'; computed, not loaded."""
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        return (RotaryEmbedding(head_dim, self.max_positions,
                                rope_parameters(self.config, "full_attention")),
                RotaryEmbedding(head_dim, self.max_positions,
                                rope_parameters(self.config, LOCAL)))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVLayer], meta: AttentionMetadata,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids)
        full = self.rotary(positions, x.dtype, "torch")
        local = self.rotary_local(positions, x.dtype, "torch")
        for layer in self.layers:
            x = layer(x, local if layer.local else full, meta)
        return self.final_norm(x)

    logits = EncoderModel.logits
