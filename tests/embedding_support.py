"""Embedding checkpoints as sentence-transformers saves them (a bare Qwen3 decoder, its Pooling
and Normalize steps), and sentence-transformers' own embeddings of them: the reference the
pooling runner must equal."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

# The sentence-transformers pooling modes, by the engine's pooling type.
ST_MODES = {"LAST": "lasttoken", "MEAN": "mean", "CLS": "cls"}
HIDDEN_SIZE = 64


def make_embedding_model(directory: str, tokenizer: Any, pooling_type: str = "LAST",
                         normalize: bool = True) -> str:
    """A random-weight Qwen3 embedding model, saved by sentence-transformers. The tokenizer is
    saved without a chat template: sentence-transformers renders text through one where the
    tokenizer has it, while `input` of /v1/embeddings is embedded as given."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    torch.manual_seed(0)
    decoder = Qwen3Model(config)
    raw = os.path.join(directory, "decoder")
    decoder.save_pretrained(raw)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    plain.save_pretrained(raw)
    transformer = Transformer(raw)
    steps = [transformer, Pooling(HIDDEN_SIZE, pooling_mode=ST_MODES[pooling_type])]
    if normalize:
        steps.append(Normalize())
    path = os.path.join(directory, "model")
    SentenceTransformer(modules=steps, device="cpu").save(path)
    return path


def st_embeddings(path: str, texts: list[str]) -> torch.Tensor:
    """sentence-transformers' embeddings of the texts, [len(texts), hidden] float32."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    return torch.as_tensor(model.encode(texts, convert_to_numpy=True), dtype=torch.float32)
