"""Scoring text pairs (vLLM's score API): which texts pair up, and a cross-encoder's prompt
for a pair of texts (a query and a document): both texts in one prompt, which the classifier
scores together."""

from __future__ import annotations

from typing import Any

from tokenmill.engine.contract.pooling import Classifier
from tokenmill.engine.core.prompt_truncation import kept_positions, token_limit


def pair_prompt(tokenizer: Any, first: str, second: str, classifier: Classifier,
                keep: int | None = None) -> tuple[list[int], tuple[int, ...] | None]:
    """The pair's token ids as the tokenizer encodes `tokenizer(first, second)` (its special
    tokens and separators), and each token's type where the classifier reads types (BERT's
    segments; else None); a classifier that joins pairs reads the two texts one after the
    other as one text (a causal LM made a reranker, vLLM's use_pad_token false).

    `keep`: at most that many tokens, cut as a tokenizer's `longest_first` truncation from the
    left cuts a pair (vLLM's truncate_prompt_tokens): each text loses its first tokens, as many
    as _longest_first_lengths says, its special tokens all kept. Where the tokenizer can't say
    which text a token belongs to (not a fast one), or the special tokens alone exceed `keep`,
    the pair comes whole, for the caller to cut as one text."""
    if classifier.joins_pairs:
        return list(tokenizer(first + second)["input_ids"]), None
    encoded = tokenizer(first, second, return_token_type_ids=classifier.token_types)
    rows = list(range(len(encoded["input_ids"])))
    if keep is not None and len(rows) > keep and getattr(encoded, "is_fast", False):
        rows = _longest_first(encoded.sequence_ids(), keep) or rows
    ids = [encoded["input_ids"][i] for i in rows]
    if not classifier.token_types:
        return ids, None
    return ids, tuple(encoded["token_type_ids"][i] for i in rows)


def cut_pair_prompt(tokenizer: Any, first: str, second: str, classifier: Classifier,
                    keep: int | None, max_model_len: int,
                    ) -> tuple[list[int], tuple[int, ...] | None]:
    """pair_prompt under vLLM's truncate_prompt_tokens `keep` (-1: the context length; None:
    whole): cut per text as the tokenizer cuts a pair, then, where that could not bring it
    within `keep`, as one prompt (prompt_truncation), its token types cut alike."""
    limit = token_limit(keep, max_model_len)
    ids, types = pair_prompt(tokenizer, first, second, classifier, limit)
    kept = kept_positions(ids, limit, tokenizer, max_model_len)
    return [ids[i] for i in kept], None if types is None else tuple(types[i] for i in kept)


def _longest_first(texts: list[int | None], keep: int) -> list[int] | None:
    """The rows kept of a pair whose rows belong to text 0, text 1 or neither (a special
    token), cut to `keep` rows as described in pair_prompt; None if no text row fits."""
    room = keep - texts.count(None)
    if room <= 0:
        return None
    totals = [texts.count(0), texts.count(1)]
    kept = _longest_first_lengths(totals[0], totals[1], room)
    dropped = [totals[0] - kept[0], totals[1] - kept[1]]  # each text's first rows
    seen = [0, 0]
    rows = []
    for row, text in enumerate(texts):
        if text is not None:
            seen[text] += 1
            if seen[text] <= dropped[text]:
                continue
        rows.append(row)
    return rows


def _longest_first_lengths(first: int, second: int, room: int) -> tuple[int, int]:
    """How many tokens of each text a pair longer than `room` keeps, by the rule of the
    `tokenizers` library's longest_first: the shorter text whole where the longer can take
    the rest of the room, else both cut to half of it (the odd token to the longer, or to
    the second of two equal ones)."""
    short, long = sorted((first, second))
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short, long = room // 2, room // 2 + room % 2
    return (short, long) if first <= second else (long, short)


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
