"""A small tokenizer with SentencePiece's conventions, as Llama 2, Mistral and Gemma ship
them: spaces written as "▁" with one put before the text, bytes for whatever the vocabulary
lacks (<0xF0> ...), and the first space dropped on decoding. No such model can be downloaded
here, and the suite's models all use byte-level BPE."""

from __future__ import annotations

import string
from typing import Any

WORDS = ["Hello", "world", "and", "café", "The", "quick", "brown", "fox"]


def llama_style_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import LlamaTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{i:02X}>": 3 + i for i in range(256)})
    for char in "▁" + string.ascii_letters + string.digits + ".,:;!?'-é":
        vocab.setdefault(char, len(vocab))
    merges = []
    for word in WORDS:  # "▁" + word, merged left to right
        piece = "▁"
        for char in word:
            merges.append((piece, char))
            piece += char
            vocab.setdefault(piece, len(vocab))
    model = models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>",
                       fuse_unk=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                 normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return LlamaTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                              unk_token="<unk>", add_bos_token=True, add_eos_token=False)
