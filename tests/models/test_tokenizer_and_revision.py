"""vLLM's --tokenizer (the tokenizer from elsewhere than the model) and --revision (a hub
model pinned to a branch, tag or commit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from store_support import COMMIT, write_hub_cache

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.random_model import BUILTIN_VOCAB_SIZE
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
from tokenmill.engine.cli import main
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.models.fetch.uri import pinned
from tokenmill.engine.models.source import TOKENIZER_FILES, ModelLoadError, ModelNotFound

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _split(tiny_llama_dir: str, tmp_path) -> tuple[str, str]:
    """The tiny model's files in two directories: one without its tokenizer files, one with
    only them."""
    weights, tokenizer = tmp_path / "weights", tmp_path / "tokenizer"
    weights.mkdir()
    tokenizer.mkdir()
    for name in os.listdir(tiny_llama_dir):
        tokenizer_file = name in TOKENIZER_FILES or name.startswith(("tokenizer", "special_",
                                                                     "chat_template"))
        shutil.copy(os.path.join(tiny_llama_dir, name),
                    tokenizer if tokenizer_file else weights)
    return str(weights), str(tokenizer)


def test_a_model_without_a_tokenizer_runs_with_one_from_elsewhere(tiny_llama_dir, tiny_llama,
                                                                   tmp_path):
    weights, tokenizer = _split(tiny_llama_dir, tmp_path)
    with pytest.raises(ModelLoadError, match="cannot read the tokenizer"):
        LLM(weights, show_progress=False)
    llm = LLM(weights, tokenizer=tokenizer, show_progress=False)
    prompt = "the quick brown fox"
    expected = tiny_llama.generate([prompt], GREEDY)[0].outputs[0]
    got = llm.generate([prompt], GREEDY)[0].outputs[0]
    assert (got.token_ids, got.text) == (expected.token_ids, expected.text)
    chat = [{"role": "user", "content": prompt}]
    assert (llm.chat(chat, GREEDY)[0].prompt_token_ids
            == tiny_llama.chat(chat, GREEDY)[0].prompt_token_ids)


def test_a_tokenizer_that_is_missing_or_too_large_is_refused(tiny_llama_dir, tmp_path):
    with pytest.raises(ModelNotFound, match=f"tokenizer '{tmp_path}/none' not found"):
        LLM(tiny_llama_dir, tokenizer=str(tmp_path / "none"), show_progress=False)
    larger = str(tmp_path / "larger")
    word_level_tokenizer(BUILTIN_VOCAB_SIZE + 8).save_pretrained(larger)
    with pytest.raises(ModelLoadError, match=f"the tokenizer '{larger}' has "
                                             f"{BUILTIN_VOCAB_SIZE + 8} tokens, more than the "
                                             f"model's vocabulary \\({BUILTIN_VOCAB_SIZE}\\)"):
        LLM(tiny_llama_dir, tokenizer=larger, show_progress=False)


def test_a_revision_pins_only_a_hub_model_once():
    assert pinned("Org/name", "v2") == "hf://Org/name@v2"
    assert pinned("hf://Org/name@v2", "v2") == "hf://Org/name@v2"
    with pytest.raises(ConfigError, match=r"revision: 'v3', but the model 'hf://Org/name@v2' "
                                          r"names revision 'v2'; give one"):
        pinned("hf://Org/name@v2", "v3")
    with pytest.raises(ConfigError, match="revision: only a hub model"):
        pinned("/models/llama", "v2")
    with pytest.raises(ConfigError, match="revision: only a hub model"):
        pinned("s3://bucket/llama", "v2")


def test_serve_refuses_a_revision_of_a_local_model_before_loading_it(tiny_llama_dir, capsys):
    assert main(["serve", "--model", tiny_llama_dir, "--revision", "v2"]) == 2
    assert capsys.readouterr().err == (f"tokenmill serve: error: revision: only a hub model "
                                       f"(hf://ORG/NAME or ORG/NAME) has revisions; the model is "
                                       f"{tiny_llama_dir!r}\n")


def test_serve_refuses_a_tokenizer_revision_of_a_local_tokenizer_before_loading(
        tiny_llama_dir, capsys):
    """vLLM's --tokenizer-revision pins a hub tokenizer: --tokenizer's, or the model's own."""
    for flags, named in ((["--tokenizer", "/models/tok"], "the tokenizer is '/models/tok'"),
                         ([], f"the tokenizer is {tiny_llama_dir!r}")):
        assert main(["serve", "--model", tiny_llama_dir, *flags,
                     "--tokenizer-revision", "v2"]) == 2
        assert capsys.readouterr().err == (f"tokenmill serve: error: tokenizer_revision: only "
                                           f"a hub model (hf://ORG/NAME or ORG/NAME) has "
                                           f"revisions; {named}\n")


def _pinned_runs(tiny_llama, cache: str, *flags: str) -> None:
    """`tokenmill generate` over an offline hub cache (a new process: the hub client reads
    HF_HUB_OFFLINE once, at import), `flags` with REVISION standing for the revision: at the
    cache's commit it answers as the tiny model does; at a revision not there it exits 1
    saying so."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}

    def generate(revision: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-P", "-m", "tokenmill.engine.cli", "generate",
             *[revision if f == "REVISION" else f for f in flags], "--download-dir", cache,
             "--raw", "--json", "--max-tokens", "6", "the quick brown fox"],
            capture_output=True, text=True, env=env, cwd="/", timeout=120)

    result = generate(COMMIT)
    assert result.returncode == 0, result.stderr
    expected = tiny_llama.generate(["the quick brown fox"],
                                   SamplingParams(temperature=0, max_tokens=6))[0].outputs[0]
    assert json.loads(result.stdout)["text"] == expected.text
    missing = generate("v9")
    assert missing.returncode == 1
    assert "revision 'v9' is not in the cache" in missing.stderr


def test_generate_loads_a_hub_tokenizer_at_its_revision(tiny_llama_dir, tiny_llama, tmp_path):
    """The weights from a directory, the tokenizer from the hub cache at the revision
    --tokenizer-revision names."""
    weights, tokenizer = _split(tiny_llama_dir, tmp_path)
    cache = str(tmp_path / "hub")
    write_hub_cache(cache, "tokenmill-test/tok", tokenizer)
    _pinned_runs(tiny_llama, cache, "--model", weights, "--tokenizer", "tokenmill-test/tok",
                 "--tokenizer-revision", "REVISION")


def test_generate_loads_the_hub_model_at_its_revision(tiny_llama_dir, tiny_llama, tmp_path):
    """From an offline hub cache, as the engine reads it in a pod."""
    cache = str(tmp_path / "hub")
    write_hub_cache(cache, "tokenmill-test/tiny-llama", tiny_llama_dir)
    _pinned_runs(tiny_llama, cache, "--model", "tokenmill-test/tiny-llama", "--revision",
                 "REVISION")
