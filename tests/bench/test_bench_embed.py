"""`tokenmill bench embed`: both sides embed the same texts, agree on the vectors, and the
report holds each side's rates, their ratio and the raw timings."""

from __future__ import annotations

import json

import pytest
from embedding_support import make_embedding_model

from tokenmill.engine.cli import main


def test_bench_embed_compares_with_sentence_transformers(tmp_path, vocab_tokenizer, capsys):
    path = make_embedding_model(str(tmp_path / "model"), vocab_tokenizer, "MEAN")
    out = tmp_path / "embed.json"
    assert main(["bench", "embed", "--model", path, "--num-texts", "6", "--input-len", "4:24",
                 "--rounds", "2", "--batch-size", "4", "--kv-cache-memory", str(16 << 20),
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["max_abs_difference"] < 1e-4
    assert result["pooler"] == {"pooling_type": "MEAN", "normalize": True}
    assert [len(s) for s in result["seconds"].values()] == [2, 2]
    rates = result["texts_per_s"]
    assert result["ratio_tokenmill_st"] == pytest.approx(
        rates["tokenmill"] / rates["sentence-transformers"])
    assert result["prompt_tokens"] >= 2 * 6 * 4  # two rounds of fresh texts
    assert "tokenmill / st" in capsys.readouterr().out


def test_bench_embed_needs_a_sentence_transformers_model(tiny_llama_dir, capsys):
    assert main(["bench", "embed", "--model", tiny_llama_dir]) == 2
    assert "is no sentence-transformers directory (modules.json)" in capsys.readouterr().err


def test_bench_embed_builds_an_encoder_of_a_named_shape(tmp_path):
    out = tmp_path / "embed.json"
    assert main(["bench", "embed", "--shape", "bert-base", "--num-layers", "1", "--dtype",
                 "float32", "--num-texts", "4", "--input-len", "4:16", "--rounds", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "bert-base"
    assert result["pooler"] == {"pooling_type": "CLS", "normalize": True}
    assert result["max_abs_difference"] < 1e-4
