"""Which safetensors files hold a model: a Mistral-style repository publishes the weights twice
(Hugging Face shards listed by model.safetensors.index.json, and Mistral's own
consolidated.safetensors under other names). The engine reads the shards only, the hub
download skips the consolidated copy, and a shard the index names but the directory lacks is
refused by name."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from model_support import hf_greedy, hf_reference, mixed_prompts
from safetensors.torch import load_file, save_file
from store_support import BUCKET, download_from_hub, s3_client, upload_directory

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.fetch import fetch_model
from tokenmill.engine.models.source import ModelLoadError
from tokenmill.engine.models.weight_files import INDEX_FILE, skipped_weight_files

MAX_NEW = 6
REPO = "tokenmill-test/mistral-style"


def _mistral_name(name: str) -> str:
    """A Hugging Face Llama/Mistral tensor name in Mistral's consolidated layout."""
    for hf, mistral in (("model.", ""), ("self_attn.q_proj", "attention.wq"),
                        ("self_attn.k_proj", "attention.wk"),
                        ("self_attn.v_proj", "attention.wv"),
                        ("self_attn.o_proj", "attention.wo"), ("mlp.gate_proj", "feed_forward.w1"),
                        ("mlp.down_proj", "feed_forward.w2"), ("mlp.up_proj", "feed_forward.w3"),
                        ("embed_tokens", "tok_embeddings"), ("lm_head", "output")):
        name = name.replace(hf, mistral)
    return name


@pytest.fixture(scope="module")
def mistral_style_dir(tmp_path_factory, tiny_llama_dir) -> str:
    """The tiny Llama as Mistral publishes: sharded in HF's layout with its index, and once
    more whole in consolidated.safetensors."""
    from transformers import AutoModelForCausalLM

    directory = str(tmp_path_factory.mktemp("mistral-style"))
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    model.save_pretrained(directory, max_shard_size="2MB")
    for name in os.listdir(tiny_llama_dir):
        if name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(os.path.join(tiny_llama_dir, name), directory)
    weights = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    save_file({_mistral_name(k): v for k, v in weights.items()},
              os.path.join(directory, "consolidated.safetensors"))
    shards = [n for n in os.listdir(directory) if n.startswith("model-")]
    assert len(shards) > 1 and os.path.isfile(os.path.join(directory, INDEX_FILE))
    return directory


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, vocab_tokenizer) -> list[list[int]]:
    model = hf_reference(tiny_llama_dir)
    return [hf_greedy(model, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


def _greedy(directory: str, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(directory, show_progress=False) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_the_shards_are_read_and_the_consolidated_copy_is_not(mistral_style_dir, expected,
                                                               vocab_tokenizer):
    assert _greedy(mistral_style_dir, mixed_prompts(vocab_tokenizer)) == expected


def test_without_an_index_the_consolidated_copy_is_passed_over(mistral_style_dir, tmp_path,
                                                               expected, vocab_tokenizer):
    directory = shutil.copytree(mistral_style_dir, tmp_path / "m")
    os.remove(directory / INDEX_FILE)
    assert _greedy(str(directory), mixed_prompts(vocab_tokenizer)) == expected


def test_a_shard_the_index_names_but_the_directory_lacks_is_refused(mistral_style_dir,
                                                                    tmp_path):
    directory = shutil.copytree(mistral_style_dir, tmp_path / "m")
    shard = sorted(n for n in os.listdir(directory) if n.startswith("model-"))[-1]
    os.remove(directory / shard)
    with pytest.raises(ModelLoadError, match=f"{INDEX_FILE} names {shard}, which is not in"):
        LLM(str(directory), show_progress=False)


def test_the_hub_download_skips_the_consolidated_copy(mistral_style_dir, tmp_path, expected,
                                                      vocab_tokenizer):
    """Through the hub's own client against a loopback hub serving the repository."""
    local, asked = download_from_hub(REPO, mistral_style_dir, str(tmp_path / "cache"))
    assert "consolidated.safetensors" not in asked
    assert any(name.startswith("model-") for name in asked)
    assert sorted(os.listdir(local)) == sorted(n for n in os.listdir(mistral_style_dir)
                                               if n != "consolidated.safetensors")
    assert _greedy(local, mixed_prompts(vocab_tokenizer)) == expected


def test_the_s3_download_skips_the_consolidated_copy(mistral_style_dir, s3_env, tmp_path):
    upload_directory(s3_client(s3_env["AWS_ENDPOINT_URL"]), BUCKET, "mistral-style",
                     mistral_style_dir)
    local = fetch_model(f"s3://{BUCKET}/mistral-style", str(tmp_path / "cache"))
    assert sorted(os.listdir(local)) == sorted(n for n in os.listdir(mistral_style_dir)
                                               if n != "consolidated.safetensors")


def test_which_files_are_passed_over():
    assert skipped_weight_files(["model-00001-of-00002.safetensors", "consolidated.safetensors",
                                 "config.json"]) == ["consolidated.safetensors"]
    # A repository holding only Mistral's layout keeps it (it is then all there is to refuse
    # or read by name).
    assert skipped_weight_files(["consolidated.safetensors", "params.json"]) == []
    assert skipped_weight_files(["model.safetensors", "tokenizer.json"]) == []
