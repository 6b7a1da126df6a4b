"""A word-level tokenizer of any vocabulary size, built with no download.

It stands in for a real model's tokenizer where only the vocabulary's size matters (the
embedding and LM-head shapes of a random-weight benchmark model) and where the built-in model
is not installed (a GPU machine has no GGUF reader): token i is the word "w<i>", so every id
decodes and every text of such words encodes back to its ids.
"""

from __future__ import annotations

from typing import Any

SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, bos, eos


def word_level_tokenizer(vocab_size: int) -> Any:
    """A PreTrainedTokenizerFast of exactly vocab_size tokens (ids 0..2 are special)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(SPECIAL):
        raise ValueError(f"a vocabulary needs more than {len(SPECIAL)} tokens, got {vocab_size}")
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=SPECIAL[0],
                                   bos_token=SPECIAL[1], eos_token=SPECIAL[2])
