"""logprobs' text_offset with SentencePiece's conventions (the server tests' models use
byte-level BPE): a prefix space and a BOS the text does not hold, a word's space, an emoji as
four byte tokens."""

from __future__ import annotations

from sentencepiece_support import llama_style_tokenizer

from tokenmill.engine.server.text_offsets import ReplyOffsets, prompt_offsets

TEXT = "Hello world 😀 and café"


def test_an_echoed_prompts_tokens_sit_where_their_text_begins():
    tokenizer = llama_style_tokenizer()
    ids = tokenizer.encode(TEXT)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert list(zip(tokens, prompt_offsets(tokenizer, ids, TEXT), strict=True)) == [
        ("<s>", 0), ("▁Hello", 0), ("▁world", 5), ("▁", 11), ("<0xF0>", 12), ("<0x9F>", 12),
        ("<0x98>", 12), ("<0x80>", 12), ("▁and", 13), ("▁café", 17)]
    assert prompt_offsets(tokenizer, ids, "<s>" + TEXT)[:3] == [0, 3, 8]  # a BOS it holds


def test_a_replys_tokens_sit_where_the_reply_text_grows_streamed_or_whole():
    tokenizer = llama_style_tokenizer()
    prompt = tokenizer.encode("Say:")
    reply = tokenizer.encode(TEXT, add_special_tokens=False)
    text = tokenizer.decode(prompt + reply)[len(tokenizer.decode(prompt)):]
    assert text == " " + TEXT
    whole = ReplyOffsets(tokenizer, prompt, 4, skip_special_tokens=True).next(reply)
    streamed = ReplyOffsets(tokenizer, prompt, 4, skip_special_tokens=True)
    assert [o for i in range(0, len(reply), 3) for o in streamed.next(reply[i:i + 3])] == whole
    for token, offset in zip(tokenizer.convert_ids_to_tokens(reply), whole, strict=True):
        if not token.startswith("<0x"):
            assert text[offset - 4:].startswith(token.replace("▁", " "))
