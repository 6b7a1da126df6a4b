"""Incremental detokenization that never emits half of a multi-byte character.

Decoding one token at a time breaks characters split across tokens (byte-level BPE) and loses
the leading space SentencePiece tokenizers attach to words. So each step decodes a short window
that starts a few tokens back (`prefix_offset`) and emits only what the newest tokens added
past `read_offset`; while the window ends in U+FFFD (an incomplete byte sequence) nothing is
emitted and the tokens wait for the next one.
"""

from __future__ import annotations

from typing import Any

CONTEXT_TOKENS = 6
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""

    def append(self, token_id: int) -> str:
        """Add one generated token; return the text it completes (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset:])
        if full_text.endswith(REPLACEMENT_CHAR) or len(full_text) <= len(prefix_text):
            return ""
        if not full_text.startswith(prefix_text):
            # A tokenizer that rewrites earlier text: fall back to the new tail only.
            new_text = self._decode(self._ids[self._read_offset:])
        else:
            new_text = full_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if len(self._ids) > 4 * CONTEXT_TOKENS:
            drop = self._prefix_offset
            self._ids = self._ids[drop:]
            self._prefix_offset -= drop
            self._read_offset -= drop
        self.text += new_text
        return new_text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )
