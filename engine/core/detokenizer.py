"""Incremental detokenization that never emits half of a multi-byte character.

Decoding one token at a time breaks characters split across tokens (byte-level BPE) and loses
the leading space SentencePiece tokenizers attach to words. So each step decodes a short window
that starts a few tokens back (`prefix_offset`) and emits only what the newest tokens added
past `read_offset`; while the window ends in U+FFFD (an incomplete byte sequence) nothing is
emitted and the tokens wait for the next one.

A tokenizer backed by the `tokenizers` library, whose decoding transformers does not change,
runs that algorithm in Rust (`tokenizers.decoders.DecodeStream`): a token costs a few times
less host time there, which a step pays once per sequence. Where the stream refuses a token
(a tokenizer whose decoding rewrites earlier text), the sequence goes on in Python.
"""

from __future__ import annotations

from typing import Any

CONTEXT_TOKENS = 6
REPLACEMENT_CHAR = "\ufffd"
# Where transformers' own decode and _decode live: a tokenizer class that overrides either
# changes the text the backend's decoder gives, so it is decoded through transformers.
_PLAIN_DECODE_MODULES = ("transformers.tokenization_utils_base",
                         "transformers.tokenization_utils_tokenizers",
                         "transformers.tokenization_utils_fast")


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""
        self._backend, self._stream = (None, None) if tokenizer is None else \
            _decode_stream(tokenizer, self._ids, skip_special_tokens)

    def append(self, token_id: int) -> str:
        """Add one generated token; return the text it completes (possibly empty; always,
        without a tokenizer: --skip-tokenizer-init)."""
        if self._tokenizer is None:
            return ""
        self._ids.append(token_id)
        if self._stream is not None:
            try:
                piece = self._stream.step(self._backend, token_id)
            except Exception:  # noqa: BLE001 - the stream refused: go on in Python
                self._stream = None
            else:
                if piece:
                    self._prefix_offset = max(0, len(self._ids) - CONTEXT_TOKENS)
                    self._read_offset = len(self._ids)
                    self._trim()
                    self.text += piece
                return piece or ""
        return self._append_in_python()

    def _append_in_python(self) -> str:
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
        self._trim()
        self.text += new_text
        return new_text

    def _trim(self) -> None:
        if len(self._ids) > 4 * CONTEXT_TOKENS:
            drop = self._prefix_offset
            self._ids = self._ids[drop:]
            self._prefix_offset -= drop
            self._read_offset -= drop

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )


def _decode_stream(tokenizer: Any, context: list[int],
                   skip_special_tokens: bool) -> tuple[Any, Any]:
    """(the backend tokenizer, a DecodeStream after `context`), or (None, None) where the
    tokenizer's text must come from transformers' decode (another library, an overridden
    decode, a cleanup of spaces), the installed `tokenizers` has no such stream, or the context
    ends inside a character (the stream would emit the context itself with the first token)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    cls = type(tokenizer)
    plain = all(getattr(getattr(cls, name, None), "__module__", None) in _PLAIN_DECODE_MODULES
                for name in ("decode", "_decode"))
    if backend is None or not plain:
        return None, None
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream

        if not isinstance(backend, Tokenizer):
            return None, None
        if REPLACEMENT_CHAR in backend.decode(context, skip_special_tokens=skip_special_tokens):
            return None, None
        return backend, DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
    except (ImportError, TypeError):  # tokenizers before DecodeStream took a context
        return None, None
