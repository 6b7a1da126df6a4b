"""Encoders (BERT, RoBERTa, XLM-RoBERTa, DistilBERT): every token of a prompt attends to every
other, so
a prompt runs whole in one step and keeps no KV cache (the engine turns chunked prefill and
the prefix cache off for them). Served by the pooling runner: embeddings, and with a
classification head, cross-encoder scores.

Parameter names equal transformers' BertModel/XLMRobertaModel (a checkpoint's `bert.` or
`roberta.` prefix is dropped at load); DistilBERT's layers are BERT's under other names, and
its config names its sizes differently (both read here and in models/encoder_weights.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.models.architecture import ENCODERS, encoder_of, position_offset
from tokenmill.engine.models.source import ModelLoadError

# transformers' names of the activations BERT-family configs use, as torch computes them.
ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


# DistilBERT's LayerNorms (its config has no epsilon).
DISTILBERT_EPS = 1e-12


def _activation(config: Any) -> str:
    return getattr(config, "hidden_act", None) or config.activation  # DistilBERT: activation


def _width(config: Any) -> int:
    return getattr(config, "intermediate_size", None) or config.hidden_dim  # DistilBERT


def _eps(config: Any) -> float:
    return getattr(config, "layer_norm_eps", None) or DISTILBERT_EPS


def check_encoder_config(config: Any) -> None:
    """ModelLoadError for an encoder config this module does not compute."""
    kind = getattr(config, "position_embedding_type", None) or "absolute"
    if kind != "absolute":
        raise ModelLoadError(f"position_embedding_type {kind!r} is not supported; tokenmill "
                             "computes absolute position embeddings")
    if _activation(config) not in ACTIVATIONS:
        raise ModelLoadError(f"activation {_activation(config)!r} is not supported "
                             f"({', '.join(ACTIVATIONS)})")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise ModelLoadError("the checkpoint is a BERT-family decoder; tokenmill serves "
                             "BERT-family encoders")


class Embeddings(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings,
                                                config.hidden_size)
        # DistilBERT has no token types.
        types = getattr(config, "type_vocab_size", 0)
        self.token_type_embeddings = nn.Embedding(types, config.hidden_size) if types else None
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=_eps(config))
        self.offset = position_offset(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_types: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions + self.offset)
        if self.token_type_embeddings is None:
            return self.LayerNorm(x)
        if token_types is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_types)
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        hidden = config.hidden_size
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.num_heads = config.num_attention_heads

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        tokens, hidden = x.shape
        q, k, v = (proj(x).view(tokens, self.num_heads, -1)
                   for proj in (self.query, self.key, self.value))
        return bidirectional_attention(q, k, v, meta).reshape(tokens, hidden)


class DenseNorm(nn.Module):
    """A projection whose output joins the residual stream, then a LayerNorm (BERT's
    post-norm): transformers' BertSelfOutput and BertOutput."""

    def __init__(self, in_features: int, config: Any):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=_eps(config))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class AttentionBlock(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.self = SelfAttention(config)
        self.output = DenseNorm(config.hidden_size, config)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.output(self.self(x, meta), x)


class Intermediate(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, _width(config))
        self.act = ACTIVATIONS[_activation(config)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class EncoderLayer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.attention = AttentionBlock(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(_width(config), config)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = self.attention(x, meta)
        return self.output(self.intermediate(x), x)


class Layers(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.layer = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))


class ClassifierHead(nn.Module):
    """A cross-encoder's head over the first token's hidden state: a dense layer and tanh
    (BERT's pooler, RoBERTa's classifier.dense; DistilBERT's pre_classifier and ReLU), then
    one output per label. Computed in float32 on the pooled rows (execution/pooled_rows.py)."""

    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out = nn.Linear(config.hidden_size, int(config.num_labels))
        self.act = torch.relu if ENCODERS[encoder_of(config)][0] == "distilbert" else torch.tanh

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        x = self.act(F.linear(pooled, self.dense.weight.float(), self.dense.bias.float()))
        return F.linear(x, self.out.weight.float(), self.out.bias.float())


class EncoderModel(nn.Module):
    """Embeddings and the encoder stack (and a classifier's head, `score`); `forward` returns
    every token's hidden state. The KV caches the runner passes are not read: no step
    attends to an earlier one."""

    def __init__(self, config: Any):
        super().__init__()
        check_encoder_config(config)
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Layers(config)
        self.score = ClassifierHead(config) if ENCODERS[encoder_of(config)][1] else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVLayer], meta: AttentionMetadata,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids, positions, token_types)
        for layer in self.encoder.layer:
            x = layer(x, meta)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """No vocabulary: an encoder's rows are pooled, never sampled."""
        return hidden.new_zeros(hidden.shape[0], 0, dtype=torch.float32)


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            meta: AttentionMetadata, window: int | None = None) -> torch.Tensor:
    """Each sequence's tokens ([tokens, heads, dim]) attend to all of that sequence's tokens
    (with `window`, to those at most `window` positions away on either side: ModernBERT's
    local layers). The step's sequences run as one padded batch; padding keys are masked
    out."""
    layout = meta.step_cache.get("encoder_batch")
    if layout is None:
        layout = meta.step_cache["encoder_batch"] = _padded_layout(meta, q.device)
    gather, mask, keep = layout
    if window is not None:
        mask = meta.step_cache.get(f"encoder_window/{window}")
        if mask is None:
            mask = meta.step_cache[f"encoder_window/{window}"] = _window_mask(layout, window)
    batch, length = gather.shape
    qh, kh, vh = (x[gather.view(-1)].view(batch, length, *x.shape[1:]).transpose(1, 2)
                  for x in (q, k, v))
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=q.shape[-1] ** -0.5)
    return o.transpose(1, 2).reshape(batch * length, *q.shape[1:])[keep]


def _window_mask(layout: tuple, window: int) -> torch.Tensor:
    """[batch, 1, length, length]: real keys within `window` positions of each query."""
    gather, mask, _ = layout
    position = torch.arange(gather.shape[1], device=gather.device)
    near = (position[:, None] - position[None, :]).abs() <= window
    return near[None, None] if mask is None else near[None, None] & mask


def _padded_layout(meta: AttentionMetadata, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per step: which token row fills each (sequence, position) of the padded batch, the mask
    of real keys (None when no sequence is padded) and the padded rows that are real tokens,
    in the step's order."""
    lengths = meta.query_lens_list
    if lengths != meta.seq_lens_list:
        raise RuntimeError("an encoder's prompt must run whole in one step (no chunked "
                           "prefill, no prefix cache)")
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    length = max(lengths)
    position = torch.arange(length, device=device)
    size = torch.tensor(lengths, device=device).unsqueeze(1)
    real = position.unsqueeze(0) < size
    gather = torch.where(real, torch.tensor(starts, device=device).unsqueeze(1) + position, 0)
    mask = None if min(lengths) == length else real[:, None, None, :]
    return gather, mask, real.view(-1).nonzero().squeeze(1)
