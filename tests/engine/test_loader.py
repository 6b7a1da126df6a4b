"""The safetensors loader: every weight lands exactly as stored (same dtype or converted, one
file or several, read by one thread or several), a tensor-parallel rank reads only its shard,
the load reports its bytes, and the host holds no second copy of the weights while loading."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from model_support import make_random_model
from safetensors.torch import load_file

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.models.loader import build_model, checkpoint_tensors, load_config
from tokenmill.engine.models.source import ModelLoadError, ModelSource


def _config(vocab: int):
    import transformers

    # Biases and an untied head: every kind of tensor a shard plan cuts (rows, columns, the
    # row-parallel bias only rank 0 holds, padded vocabulary rows).
    return transformers.LlamaConfig(
        vocab_size=vocab + 3, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=2)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory, smol_tokenizer):
    """The model saved as several safetensors files (a sharded checkpoint)."""
    from transformers import AutoModelForCausalLM

    directory = make_random_model(str(tmp_path_factory.mktemp("loader")),
                                  _config(len(smol_tokenizer)), smol_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    os.remove(os.path.join(directory, "model.safetensors"))
    model.save_pretrained(directory, max_shard_size="4MB")
    assert len([f for f in os.listdir(directory) if f.endswith(".safetensors")]) > 2
    return directory


def _stored(directory: str) -> dict[str, torch.Tensor]:
    tensors = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(directory, name)))
    return tensors


def _build(directory: str, dtype=torch.float32, tp: TPGroup | None = None, workers: int = 1):
    source = ModelSource(directory)
    return build_model(load_config(source), source, 64, dtype, torch.device("cpu"),
                       show_progress=False, tp=tp, **({"workers": workers} if workers != 1 else {}))


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_weight_is_loaded_as_stored(sharded_dir, dtype, workers):
    model = _build(sharded_dir, dtype, workers=workers)
    params = checkpoint_tensors(model)
    stored = _stored(sharded_dir)
    assert set(params) == set(stored)
    for name, tensor in stored.items():
        assert params[name].dtype == dtype
        assert torch.equal(params[name], tensor.to(dtype)), name
    report = model.load_report
    assert report.bytes == sum(t.numel() * t.element_size() for t in stored.values())
    assert report.files == len([f for f in os.listdir(sharded_dir) if f.endswith(".safetensors")])
    assert report.seconds > 0


@pytest.mark.parametrize("rank", [0, 1])
def test_a_tensor_parallel_rank_reads_only_its_shard(sharded_dir, rank):
    config = load_config(ModelSource(sharded_dir))
    plan = ShardPlan.for_model(config, rank, 2)
    model = _build(sharded_dir, tp=TPGroup(rank, 2), workers=2)
    params = checkpoint_tensors(model)
    stored = _stored(sharded_dir)
    for name, tensor in stored.items():
        assert torch.equal(params[name], plan.shard(name, tensor)), name
    total = sum(t.numel() * t.element_size() for t in stored.values())
    # Norms (and rank 0's row-parallel biases) are whole on each rank; the rest is halved.
    assert total // 2 < model.load_report.bytes < total * 0.6


def test_a_truncated_file_names_the_file(sharded_dir, tmp_path):
    for name in os.listdir(sharded_dir):
        data = Path(sharded_dir, name).read_bytes()
        if name.endswith(".safetensors"):
            data = data[: len(data) // 2]
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ModelLoadError, match="cannot read the weights in .*safetensors"):
        _build(str(tmp_path))


def test_a_tensor_the_model_lacks_is_refused(sharded_dir, tmp_path):
    from safetensors.torch import save_file

    for name in os.listdir(sharded_dir):
        if not name.endswith(".safetensors"):
            (tmp_path / name).write_bytes(Path(sharded_dir, name).read_bytes())
    tensors = _stored(sharded_dir)
    tensors["model.layers.0.extra.weight"] = torch.zeros(2)
    for name in [n for n in os.listdir(tmp_path) if n.endswith(".json") and "index" in n]:
        os.remove(tmp_path / name)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="'model.layers.0.extra.weight' has no place"):
        _build(str(tmp_path))


PEAK_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from tokenmill.engine.models.loader import build_model, load_config
    from tokenmill.engine.models.source import ModelSource

    source = ModelSource(sys.argv[1])
    config = load_config(source)
    def status():
        fields = {}
        for line in open("/proc/self/status"):
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
        return fields
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS starts again from the current RSS
    before = status()
    model = build_model(config, source, 64, torch.float32, torch.device("cpu"),
                        show_progress=False)
    after = status()
    mapped = [line.split()[-1] for line in open("/proc/self/maps")
              if line.rstrip().endswith(".safetensors")]
    print(json.dumps({"before": before, "after": after, "mapped": mapped,
                      "weights": model.load_report.bytes}))
""")


def test_loading_holds_no_second_copy_of_the_weights_in_host_memory(tmp_path, smol_tokenizer):
    """Loading leaves the weights resident once: no transient copy (the peak is where the
    resident size ends), no copy kept (anonymous memory grows by the weights, not twice), and
    no mapping of the files kept open. Growth from the load's own imports and threads (shared
    libraries are file-backed) is not the weights and is not counted against them."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(smol_tokenizer), hidden_size=256, intermediate_size=1024,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=True, max_position_embeddings=256)
    directory = make_random_model(str(tmp_path / "m"), config, smol_tokenizer)
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, directory], capture_output=True,
                         text=True, check=True, timeout=300)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    before, after, weights = m["before"], m["after"], m["weights"]
    assert weights > 60 << 20
    assert after["VmHWM"] - after["VmRSS"] < 32 << 20, m
    assert weights <= after["RssAnon"] - before["RssAnon"] < weights + (32 << 20), m
    assert m["mapped"] == [], m


def test_start_up_logs_download_and_load(tiny_llama_dir, caplog):
    from tokenmill.engine import LLM

    with caplog.at_level(logging.INFO, logger="tokenmill.engine.core.engine"):
        engine = LLM(tiny_llama_dir, show_progress=False, max_model_len=64).engine
    load = engine.load_report()
    assert load["download_seconds"] == 0
    assert load["load_seconds"] > 0
    assert load["load_bytes"] == sum(t.numel() * t.element_size()
                                     for t in _stored(tiny_llama_dir).values())
    assert load["load_gb_per_s"] == pytest.approx(load["load_bytes"] / 1e9
                                                  / load["load_seconds"])
    [record] = [r for r in caplog.records if r.getMessage() == "model loaded"]
    assert record.model == tiny_llama_dir
    assert (record.download_seconds, record.load_seconds, record.load_bytes) == (
        0, round(load["load_seconds"], 3), load["load_bytes"])


def test_a_gguf_files_config_and_tokenizer_are_parsed_once_per_process(smol_source):
    """Engines started again on the same file get copies of the first parse: changing one
    engine's copy changes no other's."""
    from tokenmill.engine.models import loader

    first_config, first = loader.load_config(smol_source), loader.load_tokenizer(smol_source)
    hits = loader._gguf_tokenizer.cache_info().hits, loader._gguf_config.cache_info().hits
    config, tokenizer = loader.load_config(smol_source), loader.load_tokenizer(smol_source)
    assert (loader._gguf_tokenizer.cache_info().hits, loader._gguf_config.cache_info().hits) \
        == (hits[0] + 1, hits[1] + 1)
    assert tokenizer is not first and config is not first_config
    assert tokenizer("The capital of France")["input_ids"] == first("The capital of France")[
        "input_ids"]
    tokenizer.model_max_length, config.num_hidden_layers = 7, 1
    assert first.model_max_length != 7 and first_config.num_hidden_layers == 30


def test_multi_token_prediction_layers_after_the_decoders_are_not_read():
    """DeepSeek-V3, GLM-4.5 and MiniMax-M2 store their draft layers numbered after the
    decoder's; only those are passed over, and only where the config declares them."""
    from types import SimpleNamespace

    from tokenmill.engine.models.loader import prediction_layer

    for declared in ({"num_nextn_predict_layers": 1}, {"num_mtp_modules": 3}):
        config = SimpleNamespace(num_hidden_layers=2, **declared)
        assert prediction_layer(config, "model.layers.2.eh_proj.weight")
        assert prediction_layer(config, "model.layers.4.self_attn.q_proj.weight")
        assert not prediction_layer(config, "model.layers.1.self_attn.q_proj.weight")
        assert not prediction_layer(config, "model.embed_tokens.weight")
    assert not prediction_layer(SimpleNamespace(num_hidden_layers=2),
                                "model.layers.2.eh_proj.weight")
