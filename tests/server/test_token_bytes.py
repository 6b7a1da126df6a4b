"""Chat logprobs' `bytes` for tokenizers of each kind: SentencePiece's byte pieces and ▁, and
the decoded text of a tokenizer that writes no bytes (WordPiece). Byte-level BPE's are checked
through the server (test_prompt_logprobs_server.py)."""

from __future__ import annotations

from encoder_support import make_wordpiece_tokenizer
from sentencepiece_support import llama_style_tokenizer

from tokenmill.engine.server.token_bytes import TokenBytes


def test_sentencepiece_byte_pieces_are_their_byte_and_a_word_keeps_its_space():
    tokenizer = llama_style_tokenizer()
    of = TokenBytes(tokenizer)
    ids = tokenizer.encode("Hello world 😀 and café")
    pieces = {tokenizer.convert_ids_to_tokens(i): of(i) for i in ids}
    assert pieces["<0xF0>"] == b"\xf0" and pieces["▁world"] == b" world"
    assert pieces["<s>"] == b"<s>"  # an added token: its text
    assert b"".join(of(i) for i in ids[1:]) == " Hello world 😀 and café".encode()


def test_a_tokenizer_without_byte_pieces_gives_each_tokens_text(tmp_path):
    tokenizer = make_wordpiece_tokenizer(str(tmp_path))
    of = TokenBytes(tokenizer)
    for token in tokenizer.encode("hello world", add_special_tokens=False):
        assert of(token) == tokenizer.decode([token]).encode()
