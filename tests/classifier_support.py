"""Sequence-classifier checkpoints as transformers saves them (random weights): a named
three-label text classifier and a one-label cross-encoder; and transformers' own logits for
them, the reference the pooling runner must equal."""

from __future__ import annotations

from typing import Any

import torch
from model_support import make_random_model

LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def make_qwen3_classifier(directory: str, tokenizer: Any) -> str:
    """Three labels, named: a text classifier."""
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=512, id2label=LABELS,
                         label2id={v: k for k, v in LABELS.items()},
                         architectures=["Qwen3ForSequenceClassification"])
    return make_random_model(directory, config, tokenizer,
                             auto_class="AutoModelForSequenceClassification")


def make_llama_cross_encoder(directory: str, tokenizer: Any) -> str:
    """One label: a cross-encoder reranker."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, num_labels=1,
                         architectures=["LlamaForSequenceClassification"])
    return make_random_model(directory, config, tokenizer,
                             auto_class="AutoModelForSequenceClassification")


def hf_logits(path: str, token_ids: list[list[int]]) -> torch.Tensor:
    """transformers' classifier logits, [prompts, labels]: one prompt at a time (no padding
    to place)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return torch.cat([model(torch.tensor([ids])).logits for ids in token_ids])


def make_qwen3_causal(directory: str, tokenizer: Any, tie: bool) -> str:
    """A causal Qwen3 (its LM head untied, or the embeddings'), as Qwen3-Reranker ships:
    served as a classifier of chosen tokens' logits."""
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=512, tie_word_embeddings=tie)
    return make_random_model(directory, config, tokenizer)


def hf_last_logits(path: str, token_ids: list[list[int]]) -> torch.Tensor:
    """transformers' next-token logits after each prompt, [prompts, vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return torch.cat([model(torch.tensor([ids])).logits[:, -1] for ids in token_ids])
