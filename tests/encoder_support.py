"""BERT-family checkpoints (random weights) as their libraries save them: a WordPiece
tokenizer written from a word list, embedding models saved by sentence-transformers, and
cross-encoders saved by transformers; and the references the engine must equal
(sentence-transformers' embeddings, transformers' logits of tokenizer(query, document))."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.engine.bench.embed import save_sentence_transformer

WORDS = ("the", "capital", "of", "france", "is", "paris", "and", "this", "sentence", "runs",
         "longer", "than", "others", "where", "berlin", "in", "germany", "hello", "world", "a",
         "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r",
         "s", "t", "u", "v", "w", "x", "y", "z", "what", "who", "how", "many", "people", "live",
         "city", "river", "big", "small")
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LABELS = {0: "contradiction", 1: "entailment", 2: "neutral"}


def make_wordpiece_tokenizer(directory: str) -> Any:
    """A BERT tokenizer (lower-cased WordPiece) over WORDS, their letters as word pieces and
    punctuation."""
    from transformers import BertTokenizerFast

    pieces = sorted({f"##{ch}" for word in WORDS for ch in word})
    tokens = SPECIAL + sorted(set(WORDS)) + pieces + list(".,?!'")
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)},
                                  do_lower_case=True)
    tokenizer.save_pretrained(directory)
    return tokenizer


def encoder_config(family: str, tokenizer: Any, **extra: Any) -> Any:
    """A small config of `family` (bert, roberta, xlm-roberta, distilbert or modernbert); two
    token types for BERT, one for RoBERTa's family, none for DistilBERT and ModernBERT, as
    their checkpoints have. ModernBERT's: a global layer then two local ones that see 4
    positions each way, as its real ones (every third layer global, 64 each way)."""
    from transformers import AutoConfig, DistilBertConfig, ModernBertConfig

    if family == "modernbert":
        ids = {f"{kind}_token_id": getattr(tokenizer, f"{kind}_token_id")
               for kind in ("pad", "cls", "sep")}
        return ModernBertConfig(vocab_size=len(tokenizer), hidden_size=64,
                                intermediate_size=96, num_hidden_layers=4,
                                num_attention_heads=4, global_attn_every_n_layers=3,
                                local_attention=8, max_position_embeddings=128,
                                bos_token_id=tokenizer.cls_token_id,
                                eos_token_id=tokenizer.sep_token_id, **ids, **extra)
    if family == "distilbert":
        return DistilBertConfig(vocab_size=len(tokenizer), dim=64, hidden_dim=128, n_layers=2,
                                n_heads=4, max_position_embeddings=128,
                                pad_token_id=tokenizer.pad_token_id, **extra)
    roberta = family != "bert"
    return AutoConfig.for_model(
        family, vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4,
        # RoBERTa's positions start after its padding id: 128 usable positions for both.
        max_position_embeddings=128 + (tokenizer.pad_token_id + 1 if roberta else 0),
        type_vocab_size=1 if roberta else 2, pad_token_id=tokenizer.pad_token_id,
        **extra)


def make_encoder_embedding(directory: str, tokenizer: Any, family: str = "bert",
                           pooling_mode: str = "cls", normalize: bool = True) -> str:
    """A random-weight encoder saved by sentence-transformers with its Pooling step."""
    from transformers import AutoModel

    torch.manual_seed(0)
    extra = {} if family in ("distilbert", "modernbert") else {"add_pooling_layer": False}
    model = AutoModel.from_config(encoder_config(family, tokenizer), **extra)
    return save_sentence_transformer(model, tokenizer, directory, pooling_mode, normalize)


def make_cross_encoder(directory: str, tokenizer: Any, family: str = "bert",
                       labels: dict[int, str] | None = None) -> str:
    """A random-weight *ForSequenceClassification encoder (one label: a reranker's score)."""
    from transformers import AutoModelForSequenceClassification

    extra = {"num_labels": 1} if labels is None else \
        {"id2label": labels, "label2id": {v: k for k, v in labels.items()}}
    torch.manual_seed(0)
    # Wide initial weights, so that every input (and token type) moves the scores.
    model = AutoModelForSequenceClassification.from_config(
        encoder_config(family, tokenizer, initializer_range=0.2, **extra))
    # Random biases, so a wrong placement of any of them shows.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def hf_pair_logits(path: str, pairs: list[tuple[str, str]]) -> torch.Tensor:
    """transformers' logits of each (query, document) pair, encoded as tokenizer(q, d) (with
    token types where the model has more than one, as RoBERTa's tokenizers give none)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    rows = []
    with torch.no_grad():
        for first, second in pairs:
            encoded = tokenizer(first, second, return_tensors="pt",
                                return_token_type_ids=model.config.type_vocab_size > 1)
            rows.append(model(**encoded).logits[0])
    return torch.stack(rows)
