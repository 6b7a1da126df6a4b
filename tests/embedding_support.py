"""Embedding checkpoints as sentence-transformers saves them (a bare Qwen3 decoder, its Pooling
and Normalize steps), and sentence-transformers' own embeddings of them: the reference the
pooling runner must equal."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.engine.bench.embed import save_sentence_transformer

# The sentence-transformers pooling modes, by the engine's pooling type.
ST_MODES = {"LAST": "lasttoken", "MEAN": "mean", "CLS": "cls"}
HIDDEN_SIZE = 64


def make_embedding_model(directory: str, tokenizer: Any, pooling_type: str = "LAST",
                         normalize: bool = True) -> str:
    """A random-weight Qwen3 embedding model, saved by sentence-transformers (its tokenizer
    without a chat template: bench/embed.py's save_sentence_transformer)."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    torch.manual_seed(0)
    return save_sentence_transformer(Qwen3Model(config), tokenizer, directory,
                                     ST_MODES[pooling_type], normalize)


def st_embeddings(path: str, texts: list[str]) -> torch.Tensor:
    """sentence-transformers' embeddings of the texts, [len(texts), hidden] float32."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    return torch.as_tensor(model.encode(texts, convert_to_numpy=True), dtype=torch.float32)
