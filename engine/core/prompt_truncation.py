"""vLLM's truncate_prompt_tokens: a prompt cut to its last tokens, within its special tokens
(the server's field, and SamplingParams' offline)."""

from __future__ import annotations

from typing import Any


def truncated(ids: list[int], keep: int | None, tokenizer: Any,
              max_model_len: int) -> list[int]:
    """`keep` tokens (-1: the context length), the prompt's last, within the special tokens
    the tokenizer puts around a text where the prompt has them (BERT's [CLS] and [SEP], a
    BOS), as the tokenizer's own truncation keeps them: an encoder pools its [CLS] row, which
    a plain cut dropped."""
    return [ids[i] for i in kept_positions(ids, keep, tokenizer, max_model_len)]


KEEP_RULE = "must be -1 (the context length) or at least 1"


def valid_keep(keep: int | None) -> bool:
    """Whether `keep` is a truncate_prompt_tokens value (None: no truncation)."""
    return keep is None or keep == -1 or keep >= 1


def token_limit(keep: int | None, max_model_len: int) -> int | None:
    """truncate_prompt_tokens as a count of tokens (-1: the context length; None: no limit)."""
    return max_model_len if keep == -1 else keep


def kept_positions(ids: list[int], keep: int | None, tokenizer: Any,
                   max_model_len: int) -> list[int]:
    """The positions of `ids` that truncated() keeps (a pair's token types follow them)."""
    n = len(ids)
    keep = token_limit(keep, max_model_len)
    if keep is None or n <= keep:
        return list(range(n))
    head, tail = special_frame(tokenizer) if tokenizer is not None else ([], [])
    h = len(head) if head and ids[:len(head)] == head else 0
    t = len(tail) if tail and ids[n - len(tail):] == tail else 0
    if keep <= h + t:  # no room for text between them: the last tokens, as they come
        h = t = 0
    return [*range(h), *range(n - keep + h, n)]


def special_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer adds before and after a text's own (found once per
    tokenizer)."""
    found = _FRAMES.get(id(tokenizer))
    if found is None or found[0] is not tokenizer:
        plain = tokenizer.encode("a", add_special_tokens=False)
        framed = tokenizer.encode("a", add_special_tokens=True)
        frame: tuple[list[int], list[int]] = ([], [])
        for start in range(len(framed) - len(plain) + 1):
            if framed[start:start + len(plain)] == plain:
                frame = framed[:start], framed[start + len(plain):]
                break
        found = _FRAMES[id(tokenizer)] = (tokenizer, frame)
    return found[1]


_FRAMES: dict[int, tuple[Any, tuple[list[int], list[int]]]] = {}
