"""Scoring text pairs (vLLM's score API): which texts pair up, and a cross-encoder's prompt
for a pair of texts (a query and a document): both texts in one prompt, which the classifier
scores together."""

from __future__ import annotations

from typing import Any

from tokenmill.engine.contract.pooling import Classifier


def pair_prompt(tokenizer: Any, first: str, second: str,
                classifier: Classifier) -> tuple[list[int], tuple[int, ...] | None]:
    """The pair's token ids as the tokenizer encodes `tokenizer(first, second)` (its special
    tokens and separators), and each token's type where the classifier reads types (BERT's
    segments; else None); a classifier that joins pairs reads the two texts one after the
    other as one text (a causal LM made a reranker, vLLM's use_pad_token false)."""
    if classifier.joins_pairs:
        return list(tokenizer(first + second)["input_ids"]), None
    encoded = tokenizer(first, second, return_token_type_ids=classifier.token_types)
    ids = list(encoded["input_ids"])
    if not classifier.token_types:
        return ids, None
    return ids, tuple(encoded["token_type_ids"])


def cosine_similarity(first: list[float], second: list[float]) -> float:
    """An embedding model's score of a pair: the cosine similarity of the two texts'
    embeddings, in float32 as sentence-transformers computes it."""
    import torch

    return torch.nn.functional.cosine_similarity(torch.tensor(first), torch.tensor(second),
                                                 dim=0).item()


def score_pairs(first: str | list[str], second: str | list[str]) -> list[tuple[str, str]]:
    """The pairs to score: one text (or a one-text list) against each of the other list, or
    two lists pair by pair; ValueError for lists of different lengths, or none."""
    first = [first] if isinstance(first, str) else list(first)
    second = [second] if isinstance(second, str) else list(second)
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second) or not first:
        raise ValueError(f"data_1 holds {len(first)} texts and data_2 {len(second)}: give "
                         "one text and a list, or two lists of the same length")
    return list(zip(first, second, strict=True))
