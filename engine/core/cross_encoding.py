"""A cross-encoder's prompt for a pair of texts (a query and a document): both texts in one
prompt, which the classifier scores together."""

from __future__ import annotations

from typing import Any


def pair_token_ids(tokenizer: Any, first: str, second: str, joined: bool = False) -> list[int]:
    """The tokenizer's own encoding of the pair (its special tokens and separators), as
    transformers encodes `tokenizer(first, second)`; with `joined`, the two texts one after
    the other as one text (a causal LM made a reranker, vLLM's use_pad_token false)."""
    if joined:
        return list(tokenizer(first + second)["input_ids"])
    return list(tokenizer(first, second)["input_ids"])
