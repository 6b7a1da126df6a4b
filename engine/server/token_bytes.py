"""A token's own UTF-8 bytes, for chat logprobs' `bytes`.

OpenAI gives each token's bytes so that a client can join the tokens of a character split
over several (an emoji in byte-level BPE) back into it; the bytes of the token's decoded text
would be those of U+FFFD for each part. The bytes come from the token's own string: byte-level
BPE (GPT-2's, Llama 3's, Qwen's) writes each byte as one printable character, SentencePiece
writes a byte it has no piece for as `<0xF0>` and a space as `▁`. A tokenizer of another kind,
and an added token (`<|im_start|>`), gives the bytes of its decoded text.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=8)
def token_bytes(tokenizer: Any) -> TokenBytes:
    """The tokenizer's TokenBytes, built once (it reads the tokenizer's decoder)."""
    return TokenBytes(tokenizer)


class TokenBytes:
    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        kinds = _decoder_kinds(tokenizer)
        self._byte_level = _byte_level_table() if "ByteLevel" in kinds else None
        self._byte_fallback = "ByteFallback" in kinds
        self._added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def __call__(self, token_id: int) -> bytes:
        if token_id not in self._added and (self._byte_level or self._byte_fallback):
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str):
                if self._byte_level is not None:
                    try:
                        return bytes(self._byte_level[ch] for ch in piece)
                    except KeyError:
                        pass
                else:
                    byte = _BYTE_PIECE.fullmatch(piece)
                    if byte:
                        return bytes([int(byte.group(1), 16)])
                    return piece.replace("▁", " ").encode("utf-8")
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")


def _decoder_kinds(tokenizer: Any) -> set[str]:
    """The types of the `tokenizers` decoder's steps (a Sequence's too); empty for a
    tokenizer not backed by that library."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    try:
        found, pending = set(), [json.loads(decoder.__getstate__())]
    except (TypeError, ValueError, AttributeError):
        return set()
    while pending:
        step = pending.pop()
        found.add(step.get("type"))
        pending.extend(step.get("decoders") or [])
    return found


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's character for each byte, reversed."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}
