"""Incremental detokenization emits exactly the full decode, never half a character, through
the `tokenizers` stream and through the Python path alike."""

from __future__ import annotations

import pytest
from sentencepiece_support import llama_style_tokenizer

from tokenmill.engine.core import detokenizer
from tokenmill.engine.core.detokenizer import IncrementalDetokenizer


@pytest.fixture(params=["stream", "python"], autouse=True)
def path(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(detokenizer, "_decode_stream", lambda *args: (None, None))
    return request.param

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


def test_a_fast_tokenizer_decodes_in_the_stream_unless_its_class_changes_decoding(
        smol_tokenizer, path):
    assert (IncrementalDetokenizer(smol_tokenizer, [])._stream is not None) == (path == "stream")

    class Rewriting(type(smol_tokenizer)):
        def decode(self, *args, **kwargs):
            return super().decode(*args, **kwargs).upper()

    rewriting = Rewriting.__new__(Rewriting)
    rewriting.__dict__.update(smol_tokenizer.__dict__)
    detok = IncrementalDetokenizer(rewriting, [])
    assert detok._stream is None
    ids = smol_tokenizer.encode("Paris is big")
    assert "".join(detok.append(t) for t in ids) == "PARIS IS BIG"


def test_a_token_the_stream_refuses_goes_on_in_python(smol_tokenizer, path):
    class Refusing:
        def step(self, backend, token_id):
            raise ValueError("the decoded text does not start with the text before")

    ids = smol_tokenizer.encode("Paris is the capital")
    detok = IncrementalDetokenizer(smol_tokenizer, [])
    pieces = [detok.append(t) for t in ids[:2]]
    detok._stream = detok._stream and Refusing()
    pieces += [detok.append(t) for t in ids[2:]]
    assert "".join(pieces) == detok.text == smol_tokenizer.decode(ids)


def test_a_prompt_that_ends_inside_a_character_emits_only_the_generated_text(smol_tokenizer):
    emoji = smol_tokenizer.encode("🎉")
    prompt = smol_tokenizer.encode("contact deg") + emoji[:1]  # half of the emoji's bytes
    generated = smol_tokenizer.encode('{"name": "x"}')
    detok = IncrementalDetokenizer(smol_tokenizer, prompt)
    assert "".join(detok.append(t) for t in generated) == detok.text == '{"name": "x"}'


def test_special_tokens_are_skipped(smol_tokenizer):
    ids = smol_tokenizer.encode("Hi") + [smol_tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(smol_tokenizer, [])
    assert "".join(detok.append(t) for t in ids) == "Hi"


def test_sentencepiece_words_keep_their_spaces_and_bytes_join_into_characters():
    """Decoded alone, a SentencePiece word loses its space and a byte is U+FFFD: the pieces
    still join to the text the whole sequence decodes to."""
    tokenizer = llama_style_tokenizer()
    prompt = tokenizer.encode("Say:")
    before = tokenizer.decode(prompt, skip_special_tokens=True)
    for text in [*TEXTS, "Hello world, the quick brown fox and café"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok = IncrementalDetokenizer(tokenizer, prompt)
        pieces = [detok.append(t) for t in ids]
        assert all("\ufffd" not in p for p in pieces)
        whole = tokenizer.decode(prompt + ids, skip_special_tokens=True)
        assert "".join(pieces) == detok.text == whole[len(before):]
        assert tokenizer.decode(ids[:1]) != pieces[0]  # alone, the first word lost its space
    assert "<0xF0>" in tokenizer.convert_ids_to_tokens(tokenizer.encode(TEXTS[-1]))
