"""--ignore-patterns (vLLM's flag): the files of a hf:// or s3:// model the patterns match are
not downloaded, by `tokenmill download` (an init container) and by the engine alike; a LoRA
adapter is downloaded whole whatever they say."""

from __future__ import annotations

import os
import shutil

import pytest
from store_support import BUCKET, download_from_hub, same_files, upload_directory

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.models.fetch import ModelFetchError, fetch_model

REPO = "tokenmill-test/llama-with-original"
ORIGINAL = ("original/params.json", "original/tokenizer.model", "original/consolidated.00.pth")


@pytest.fixture(scope="module")
def with_original(tmp_path_factory, tiny_llama_dir) -> str:
    """The tiny Llama with a second copy in Meta's format beside it, as Llama 3's repositories
    have one under original/."""
    directory = tmp_path_factory.mktemp("with-original") / "repo"
    shutil.copytree(tiny_llama_dir, directory)
    for name in ORIGINAL:
        path = directory / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(name * 16)  # contents of their own: the hub client fetches a blob once
    return str(directory)


def test_the_hub_download_leaves_out_what_the_patterns_match(with_original, tiny_llama_dir,
                                                             tmp_path):
    _, asked = download_from_hub(REPO, with_original, str(tmp_path / "whole"))
    assert {"original/params.json", "original/tokenizer.model"} <= set(asked)
    local, asked = download_from_hub(REPO, with_original, str(tmp_path / "cache"),
                                     "--ignore-patterns", "original/*")
    assert asked and not [name for name in asked if name.startswith("original/")]
    assert same_files(local, tiny_llama_dir)


def test_the_engine_leaves_them_out_of_an_s3_model(s3_env, bucket, with_original,
                                                   tiny_llama_dir, tmp_path):
    upload_directory(bucket, BUCKET, "with-original", with_original)
    uri = f"s3://{BUCKET}/with-original"
    whole = fetch_model(uri, str(tmp_path / "whole"))
    assert os.path.isfile(os.path.join(whole, "original", "consolidated.00.pth"))
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    cache = str(tmp_path / "cache")
    with LLM(uri, download_dir=cache, ignore_patterns="original/*", show_progress=False) as llm:
        assert len(llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids) == 4
    assert same_files(os.path.join(cache, "s3", BUCKET, "with-original"), tiny_llama_dir)


def test_an_adapter_is_downloaded_whole(s3_env, bucket, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    upload_directory(bucket, BUCKET, "lora/whole", str(adapter))
    local = fetch_model(f"s3://{BUCKET}/lora/whole", str(tmp_path / "cache"),
                        ("*.safetensors",))
    assert same_files(local, str(adapter))


def test_patterns_that_leave_nothing_name_the_flag(s3_env, bucket, tiny_llama_dir, tmp_path):
    upload_directory(bucket, BUCKET, "left-empty", tiny_llama_dir)
    with pytest.raises(ModelFetchError, match=r"--ignore-patterns \* leaves none of the"):
        fetch_model(f"s3://{BUCKET}/left-empty", str(tmp_path / "cache"), ("*",))


def test_an_empty_pattern_is_refused():
    with pytest.raises(ConfigError, match="ignore_patterns: must be non-empty patterns"):
        EngineConfig(ignore_patterns=("original/*", ""))
