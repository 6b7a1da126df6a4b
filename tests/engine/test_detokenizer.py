"""Incremental detokenization emits exactly the full decode, never half a character."""

from __future__ import annotations

from tokenmill.engine.core.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Paris is the capital of France.",
    "Ünïcödé: 東京は日本の首都です。 🎉🚀 naïve café",
    "  leading spaces and\nnewlines\ttabs",
    "emoji-only 👩‍👩‍👧‍👦👍🏽",
]


def test_streamed_pieces_join_to_the_full_text(smol_tokenizer):
    prompt = smol_tokenizer.encode("Say something:")
    for text in TEXTS:
        ids = smol_tokenizer.encode(text)
        detok = IncrementalDetokenizer(smol_tokenizer, prompt)
        pieces = [detok.append(t) for t in ids]
        assert all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) == detok.text == smol_tokenizer.decode(ids)


def test_multibyte_character_split_across_tokens_waits_for_completion(smol_tokenizer):
    ids = smol_tokenizer.encode("🎉")
    assert len(ids) > 1  # byte-level BPE splits the emoji
    detok = IncrementalDetokenizer(smol_tokenizer, [])
    pieces = [detok.append(t) for t in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🎉"


def test_special_tokens_are_skipped(smol_tokenizer):
    ids = smol_tokenizer.encode("Hi") + [smol_tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(smol_tokenizer, [])
    assert "".join(detok.append(t) for t in ids) == "Hi"
