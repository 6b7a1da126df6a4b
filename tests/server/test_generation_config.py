"""--generation-config: a request's unset sampling settings take the model's recommended values
(generation_config.json), as vLLM's default does; `vllm` keeps the API's own defaults."""

from __future__ import annotations

import json
import shutil

import pytest
from server_support import in_process_server

from tokenmill.engine.core.generation_config import generation_defaults, load_generation_config


@pytest.fixture(scope="module")
def greedy_by_default(tmp_path_factory, tiny_llama_dir):
    """The tiny model, its generation config recommending top_k 1 (greedy)."""
    directory = tmp_path_factory.mktemp("recommends-greedy")
    shutil.copytree(tiny_llama_dir, directory, dirs_exist_ok=True)
    (directory / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "top_k": 1, "top_p": 0.9, "temperature": 1.0,
         "bos_token_id": 1, "eos_token_id": 2}))
    return str(directory)


def test_the_files_sampling_settings_are_read(greedy_by_default, tmp_path):
    assert generation_defaults(load_generation_config(greedy_by_default)) == {
        "temperature": 1.0, "top_p": 0.9, "top_k": 1}
    assert load_generation_config(str(tmp_path)) is None
    assert generation_defaults(None) == {}


@pytest.mark.parametrize("mode", ["auto", "vllm", "directory"])
def test_unset_sampling_fields_take_the_models_values(greedy_by_default, tiny_llama_dir, mode):
    """`directory`: the model recommends nothing; --generation-config names the directory of
    a generation_config.json that recommends greedy, as auto reads the model's own."""
    prompt = [312, 1040, 2203, 77, 4511]
    model, option = greedy_by_default, mode
    if mode == "directory":
        model, option = tiny_llama_dir, greedy_by_default
    with in_process_server(model, "m", options={"generation_config": option},
                           max_model_len=128) as server:
        client = server.client
        greedy = client.completions.create(model="m", prompt=prompt, max_tokens=12,
                                           temperature=0).choices[0].text
        unset = [client.completions.create(model="m", prompt=prompt, max_tokens=12,
                                           seed=seed).choices[0].text for seed in range(3)]
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8, seed=1)
        chat_greedy = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            temperature=0)
        explicit = client.completions.create(model="m", prompt=prompt, max_tokens=12, seed=0,
                                             extra_body={"top_k": -1}).choices[0].text
    if mode != "vllm":
        assert unset == [greedy] * 3
        assert chat.choices[0].message.content == chat_greedy.choices[0].message.content
        assert server.state.sampling_defaults == {"temperature": 1.0, "top_p": 0.9, "top_k": 1}
    else:
        assert greedy not in unset and server.state.sampling_defaults == {}
    assert explicit != greedy  # a field the request sets wins over the model's value


@pytest.mark.parametrize("mode, overrides, expected", [
    ("auto", {"top_k": -1, "max_new_tokens": 5},
     {"temperature": 1.0, "top_p": 0.9, "top_k": -1, "max_new_tokens": 5}),
    ("vllm", {"top_k": 1}, {"top_k": 1}),
])
def test_overrides_win_over_the_models_values(greedy_by_default, mode, overrides, expected):
    """vLLM's --override-generation-config: merged over the model's values under auto, alone
    under vllm; max_new_tokens caps a request that sets no max_tokens."""
    prompt = [312, 1040, 2203, 77, 4511]
    with in_process_server(greedy_by_default, "m", max_model_len=128,
                           options={"generation_config": mode,
                                    "generation_overrides": overrides}) as server:
        client = server.client
        greedy = client.completions.create(model="m", prompt=prompt, max_tokens=5,
                                           temperature=0).choices[0].text
        unset = [client.completions.create(model="m", prompt=prompt, max_tokens=5,
                                           seed=seed).choices[0].text for seed in range(3)]
        uncapped = client.chat.completions.create(  # a chat sets no max_tokens by default
            model="m", messages=[{"role": "user", "content": "hi"}], temperature=0,
            extra_body={"ignore_eos": True})
    assert server.state.sampling_defaults == expected
    if mode == "auto":  # top_k -1 undoes the model's top_k 1: sampled, not greedy
        assert unset != [greedy] * 3
        assert uncapped.usage.completion_tokens == 5
        assert uncapped.choices[0].finish_reason == "length"
    else:  # the override alone makes it greedy; no cap: the context is the limit
        assert unset == [greedy] * 3
        assert uncapped.usage.completion_tokens > 5
