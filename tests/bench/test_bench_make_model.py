"""`tokenmill bench make-model`: random-weight checkpoints of real shapes, with the built-in
tokenizer or a word-level one of the shape's own vocabulary (what a GPU machine without a GGUF
reader uses)."""

from __future__ import annotations

import pytest

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench import random_model
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer


def test_every_shape_has_its_tokenizers_vocabulary():
    assert set(random_model.VOCAB_SIZES) == set(random_model.SHAPES)
    assert random_model.VOCAB_SIZES["llama-3.1-8b"] == 128256


def test_a_word_level_tokenizer_has_exactly_the_size_asked_and_round_trips():
    tokenizer = word_level_tokenizer(1000)
    assert len(tokenizer) == 1000
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    ids = tokenizer.encode("w3 w999 w500", add_special_tokens=False)
    assert ids == [3, 999, 500]
    assert tokenizer.decode(ids) == "w3 w999 w500"
    with pytest.raises(ValueError, match="more than 3 tokens"):
        word_level_tokenizer(3)


def test_a_word_level_checkpoint_has_the_shapes_vocabulary_and_serves(tmp_path, monkeypatch):
    monkeypatch.setitem(random_model.SHAPES, "tiny", ("LlamaConfig", dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128)))
    monkeypatch.setitem(random_model.VOCAB_SIZES, "tiny", 777)
    directory = random_model.make_model("tiny", str(tmp_path / "m"), "float32",
                                        tokenizer="word-level")
    with LLM(directory, show_progress=False, kv_cache_memory=8 << 20) as llm:
        assert llm.engine.model_config.vocab_size == 777
        out = llm.generate(["w5 w6 w7"], SamplingParams(temperature=0, max_tokens=4,
                                                          ignore_eos=True))[0]
        assert out.prompt_token_ids[-3:] == [5, 6, 7] and len(out.outputs[0].token_ids) == 4


def test_the_tiny_deep_shape_with_a_word_level_vocabulary_of_any_size(tmp_path):
    """What bench serve's host-bound runs serve: tiny-deep, one layer, 300 words."""
    import json

    from tokenmill.engine.cli import main

    out = tmp_path / "tiny"
    assert main(["bench", "make-model", "tiny-deep", str(out), "--num-layers", "1",
                 "--dtype", "float32", "--tokenizer", "word-level", "--vocab-size", "300"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (
        300, 1, 64)
    with LLM(str(out), show_progress=False, kv_cache_memory=8 << 20) as llm:
        assert len(llm.engine.tokenizer) == 300


def test_the_hybrid_small_shape_repeats_its_layer_pattern_over_fewer_layers(tmp_path):
    """Qwen3.5's three gated delta nets to one attention layer, cut to six layers: the engine
    serves it with a KV pool for its one attention layer."""
    import json

    from tokenmill.engine.cli import main

    out = tmp_path / "hybrid"
    assert main(["bench", "make-model", "hybrid-small", str(out), "--num-layers", "6",
                 "--dtype", "float32", "--tokenizer", "word-level", "--vocab-size", "300"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 2
    with LLM(str(out), show_progress=False, kv_cache_memory=8 << 20) as llm:
        assert llm.engine.runner.kv_pool.shape[0] == 1
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))[0]
        assert len(out.outputs[0].token_ids) == 2


def test_a_vocabulary_size_without_the_word_level_tokenizer_exits_2(tmp_path, capsys):
    from tokenmill.engine.cli import main

    assert main(["bench", "make-model", "tiny-deep", str(tmp_path / "m"),
                 "--vocab-size", "300"]) == 2
    assert "--vocab-size needs --tokenizer word-level" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
