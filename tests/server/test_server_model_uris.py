"""`tokenmill serve --model s3://...` and `--model hf://...` (an offline hub cache) download
or find the model, then answer the official openai client with HF's greedy tokens on the
same weights."""

from __future__ import annotations

import pytest
import torch
from model_support import hf_greedy
from server_support import ServeProcess, load_metrics, openai_client
from store_support import BUCKET, TINY_PREFIX, hub_serving, write_hub_cache

MAX_NEW = 8


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, smol_tokenizer):
    """The prompt's ids and HF transformers' greedy continuation of them on the tiny model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    prompt = smol_tokenizer("The capital of France is")["input_ids"]
    return prompt, smol_tokenizer.decode(hf_greedy(model, prompt, MAX_NEW))


def _served_text(model: str, env: dict[str, str], download_dir: str, prompt: list[int],
                 metrics: dict[str, float] | None = None, positional: bool = False,
                 extra: tuple[str, ...] = ()) -> str:
    """The server's greedy continuation of `prompt`; its model load metrics go to `metrics`.
    `positional`: `tokenmill serve MODEL`, as vLLM takes it, instead of --model. `extra`:
    more flags."""
    flags = ("--served-model-name", "tiny", "--download-dir", download_dir, "--max-num-seqs",
             "4", "--block-size", "8", *extra)
    proc = (ServeProcess.positional(model, *flags, env=env) if positional
            else ServeProcess(model, *flags, env=env))
    try:
        proc.wait_healthy(180)
        out = openai_client(proc.url + "/v1").completions.create(
            model="tiny", prompt=prompt, max_tokens=MAX_NEW, temperature=0)
        if metrics is not None:
            metrics.update(load_metrics(proc.url))
        return out.choices[0].text
    finally:
        proc.kill()
        proc.wait()


def test_serves_a_model_from_s3_with_hf_greedy_output(s3_env, tmp_path, reference):
    prompt, expected = reference
    metrics: dict[str, float] = {}
    assert _served_text(f"s3://{BUCKET}/{TINY_PREFIX}", s3_env, str(tmp_path),
                        prompt, metrics) == expected
    # Downloaded by this server: the download took time, and so did the load after it.
    assert 0 < metrics["tokenmill_model_download_seconds"] < 180
    assert metrics["tokenmill_model_load_seconds"] > 0


def test_serves_a_model_from_an_offline_hub_cache_with_hf_greedy_output(tmp_path,
                                                                         tiny_llama_dir,
                                                                         reference):
    prompt, expected = reference
    cache = str(tmp_path / "hub")
    write_hub_cache(cache, "tokenmill-test/tiny-llama", tiny_llama_dir)
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing answers there
    # vLLM's form, `serve ORG/NAME` (the bare id is hf://ORG/NAME: test_download_command.py
    # finds both at the same snapshot).
    assert _served_text("tokenmill-test/tiny-llama", env, cache, prompt,
                        positional=True) == expected


def test_hf_token_reaches_the_hub_with_every_request(tmp_path, tiny_llama_dir, reference):
    """vLLM's --hf-token: the hub (a loopback one serving the repository) sees the token on
    every call of the download, and the server then answers as from any other source."""
    prompt, expected = reference
    seen: list[tuple[str, str | None]] = []
    with hub_serving("tokenmill-test/tiny-llama", tiny_llama_dir,
                     authorizations=seen) as hub:
        env = {"HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
               "HF_TOKEN": ""}
        assert _served_text("hf://tokenmill-test/tiny-llama", env, str(tmp_path / "hub"),
                            prompt, extra=("--hf-token", "hf_from_the_flag")) == expected
    # The client's own calls that are not about the repository may go without it.
    calls = [auth for path, auth in seen if "/tokenmill-test/tiny-llama/" in path]
    assert len(calls) >= 3 and set(calls) == {"Bearer hf_from_the_flag"}


def test_a_model_that_cannot_be_fetched_ends_the_server_with_one_line(s3_env, tmp_path):
    model = f"s3://{BUCKET}/llama/nothing"
    code, stderr = ServeProcess(model, "--download-dir", str(tmp_path), env=s3_env).finish()
    assert code == 1
    [line] = [line for line in stderr.splitlines() if "cannot fetch" in line]
    assert "model failed to load; exiting" in line
    assert f"cannot fetch {model}: no objects under the prefix 'llama/nothing/'" in line
