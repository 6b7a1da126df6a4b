"""Where each token begins in a completion choice's text: logprobs' `text_offset`.

A token's text decoded alone is no measure of its place: each part of a character split over
tokens decodes as U+FFFD, and a SentencePiece word decoded alone loses its leading space, so
adding up those lengths drifts off the text from the first such token on. Offsets follow the
incremental detokenizer that writes the reply instead: a token begins where the text written
before it ends, so a token that continues a character begins at that character.
"""

from __future__ import annotations

from typing import Any

from tokenmill.engine.core import IncrementalDetokenizer


class ReplyOffsets:
    """A reply's tokens, streamed or whole: decoded as the engine decodes them (the same
    context, the same special tokens skipped), so the text they add is the reply's text."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int], start: int,
                 skip_special_tokens: bool):
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
        self._at = start

    def next(self, token_ids: list[int]) -> list[int]:
        """The offsets of the reply's next tokens."""
        offsets = []
        for token in token_ids:
            offsets.append(self._at)
            self._at += len(self._detokenizer.append(token))
        return offsets


def prompt_offsets(tokenizer: Any, token_ids: list[int], text: str) -> list[int]:
    """An echoed prompt's offsets in `text`, the prompt as the request wrote it. What the
    tokenizer added that the text does not hold takes no room: a special token (a BOS) that
    is not written there, the space SentencePiece puts before the first word."""
    detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    special = set(getattr(tokenizer, "all_special_ids", ()))
    offsets, at = [], 0
    for token in token_ids:
        offsets.append(at)
        piece = detokenizer.append(token)
        if text.startswith(piece, at):
            at += len(piece)
        elif text.startswith(piece.lstrip(" "), at):
            at += len(piece.lstrip(" "))
        elif token not in special:
            at += len(piece)
    return offsets
