"""Models published before safetensors (PyTorch's pickled pytorch_model*.bin files, sharded
under pytorch_model.bin.index.json or whole): read where no safetensors weights are, alone and
under tensor parallelism; downloaded from the hub where they are all a repository has, and
passed over where it has safetensors weights too."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from model_support import hf_greedy, hf_reference, mixed_prompts
from safetensors.torch import load_file
from store_support import download_from_hub

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.source import ModelLoadError
from tokenmill.engine.models.weight_files import TORCH_INDEX_FILE, skipped_weight_files

MAX_NEW = 6
REPO = "tokenmill-test/pickled"


def _pickle(source: str, directory: str, shards: int) -> None:
    """The source model's files, its weights as PyTorch's pickled shards with their index
    (one shard: pytorch_model.bin alone, as the oldest repositories have it)."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(source):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(source, name), directory)
    weights = load_file(os.path.join(source, "model.safetensors"))
    if shards == 1:
        torch.save(weights, os.path.join(directory, "pytorch_model.bin"))
        return
    names = sorted(weights)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {name: weights[name] for name in names[i::shards]}
        torch.save(part, os.path.join(directory, file))
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(directory, TORCH_INDEX_FILE), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, vocab_tokenizer) -> list[list[int]]:
    model = hf_reference(tiny_llama_dir)
    return [hf_greedy(model, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


def _greedy(directory: str, prompts: list[list[int]], **options) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(directory, show_progress=False, **options) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("shards,tp", [(1, 1), (3, 1), (3, 2)])
def test_pickled_weights_are_read_where_no_safetensors_are(tiny_llama_dir, tmp_path, expected,
                                                           vocab_tokenizer, shards, tp):
    directory = str(tmp_path / "pickled")
    _pickle(tiny_llama_dir, directory, shards)
    got = _greedy(directory, mixed_prompts(vocab_tokenizer), tensor_parallel_size=tp)
    assert got == expected


def test_a_pickled_shard_the_index_names_but_the_directory_lacks_is_refused(tiny_llama_dir,
                                                                            tmp_path):
    directory = str(tmp_path / "pickled")
    _pickle(tiny_llama_dir, directory, 2)
    os.remove(os.path.join(directory, "pytorch_model-00002-of-00002.bin"))
    with pytest.raises(ModelLoadError, match=f"{TORCH_INDEX_FILE} names pytorch_model-00002"):
        LLM(directory, show_progress=False)


def test_a_pickled_file_that_is_not_a_state_dict_is_refused_naming_it(tiny_llama_dir,
                                                                      tmp_path):
    """torch.load's weights_only unpickler refuses anything but tensors and containers."""
    directory = str(tmp_path / "pickled")
    _pickle(tiny_llama_dir, directory, 1)
    torch.save([torch.zeros(2)], os.path.join(directory, "pytorch_model.bin"))
    with pytest.raises(ModelLoadError, match="pytorch_model.bin holds a list"):
        LLM(directory, show_progress=False)


def test_pre_quantized_pickled_weights_are_refused(tiny_llama_dir, tmp_path):
    directory = str(tmp_path / "pickled")
    _pickle(tiny_llama_dir, directory, 1)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ModelLoadError, match="fp8 weights in PyTorch's pickled files; "
                                             "pre-quantized checkpoints are read from "
                                             "safetensors"):
        LLM(directory, show_progress=False)


@pytest.mark.parametrize("with_safetensors", [False, True])
def test_the_hub_download_takes_pickled_weights_only_where_they_are_all(
        tiny_llama_dir, tmp_path, expected, vocab_tokenizer, with_safetensors):
    """Through the hub's own client against a loopback hub serving the repository."""
    repository = str(tmp_path / "repository")
    _pickle(tiny_llama_dir, repository, 1)
    if with_safetensors:
        shutil.copy(os.path.join(tiny_llama_dir, "model.safetensors"), repository)
    local, asked = download_from_hub(REPO, repository, str(tmp_path / "cache"))
    assert ("pytorch_model.bin" in asked) is not with_safetensors
    assert ("model.safetensors" in asked) is with_safetensors
    assert _greedy(local, mixed_prompts(vocab_tokenizer)) == expected


def test_pickled_copies_are_passed_over_beside_safetensors_weights():
    assert skipped_weight_files(["model.safetensors", "pytorch_model.bin", "config.json"]) == \
        ["pytorch_model.bin"]
    assert skipped_weight_files(["pytorch_model.bin", "config.json"]) == []
