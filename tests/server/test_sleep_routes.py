"""Sleep mode over HTTP (vLLM's routes): POST /sleep, POST /wake_up, GET /is_sleeping, and
SGLang's POST /update_weights_from_disk, with --enable-sleep-mode only; asleep, the official
client's requests get a 503 and /health a 200."""

from __future__ import annotations

import os
import shutil

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file
from server_support import in_process_server, openai_client

from tokenmill.engine import LLM, SamplingParams

KEY = "sleep-key"
ASK = dict(model="tiny", prompt="hello there", max_tokens=6, temperature=0,
           extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    with in_process_server(tiny_llama_dir, "tiny", options={"api_key": KEY},
                           kv_cache_memory=16 << 20, max_model_len=512,
                           enable_sleep_mode=True) as server:
        yield server


def _sleeping_gauge(server) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=10).text
    [value] = [sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == "tokenmill_engine_sleeping"]
    return value


def _http(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30,
                        headers={"Authorization": f"Bearer {KEY}"})


def test_asleep_requests_get_503_and_after_wake_up_the_same_answer(server):
    client = openai_client(f"{server.url}/v1", KEY)
    before = client.completions.create(**ASK).choices[0].text
    with _http(server) as http:
        assert http.get("/is_sleeping").json() == {"is_sleeping": False}
        assert _sleeping_gauge(server) == 0
        assert http.post("/sleep", params={"level": 1}).status_code == 200
        assert http.get("/is_sleeping").json() == {"is_sleeping": True}
        assert _sleeping_gauge(server) == 1
        assert server.state.engine.engine.runner.kv_pool is None
        assert http.get("/health").status_code == 200
        with pytest.raises(openai.InternalServerError) as refused:
            client.completions.create(**ASK)
        assert refused.value.status_code == 503
        assert "the engine is asleep" in refused.value.message
        assert http.post("/wake_up", params={"tags": "weights"}).status_code == 200
        assert http.get("/is_sleeping").json() == {"is_sleeping": True}
        assert http.post("/wake_up", params={"tags": "kv_cache"}).status_code == 200
        assert http.get("/is_sleeping").json() == {"is_sleeping": False}
        assert _sleeping_gauge(server) == 0
    assert client.completions.create(**ASK).choices[0].text == before


def test_bad_levels_and_tags_are_400_and_the_key_guards_the_routes(server):
    with _http(server) as http:
        level = http.post("/sleep", params={"level": 3})
        assert level.status_code == 400 and level.json()["error"]["param"] == "level"
        assert "level 3 is not supported" in level.json()["error"]["message"]
        tags = http.post("/wake_up", params={"tags": "everything"})
        assert tags.status_code == 400 and tags.json()["error"]["param"] == "tags"
        assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert httpx.post(server.url + "/sleep", timeout=30).status_code == 401


@pytest.fixture(scope="module")
def trained(tiny_llama_dir, tmp_path_factory) -> str:
    """The tiny model with every matrix moved, as a trainer's next checkpoint would be."""
    directory = shutil.copytree(tiny_llama_dir, tmp_path_factory.mktemp("t") / "trained")
    path = os.path.join(directory, "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    tensors = {name: t + 0.05 * torch.randn(t.shape, generator=gen) if t.dim() > 1 else t
               for name, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    return str(directory)


def test_new_weights_from_disk_are_served_at_once(server, trained, tiny_llama_dir):
    """What a trainer beside the server does: level 2 sleep while it trains, wake, read the
    new checkpoint; the replies are then the new weights' (as the offline engine gives
    them), and reading the old path brings the old replies back."""
    client = openai_client(f"{server.url}/v1", KEY)
    before = client.completions.create(**ASK).choices[0].text
    with LLM(trained, show_progress=False, kv_cache_memory=16 << 20) as llm:
        ids = server.state.tokenizer.encode(ASK["prompt"])
        after = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=6,
                                                   ignore_eos=True))[0].outputs[0].text
    assert after != before
    with _http(server) as http:
        assert http.post("/sleep", params={"level": 2}).status_code == 200
        assert http.post("/wake_up").status_code == 200
        update = http.post("/update_weights_from_disk", json={"model_path": trained})
        assert update.status_code == 200 and update.json()["success"] is True, update.text
        assert client.completions.create(**ASK).choices[0].text == after
        assert http.post("/update_weights_from_disk").status_code == 200  # the latest again
        assert client.completions.create(**ASK).choices[0].text == after
        missing = http.post("/update_weights_from_disk", json={"model_path": "/nowhere"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "model_path"
        assert client.completions.create(**ASK).choices[0].text == after
        back = http.post("/update_weights_from_disk", json={"model_path": tiny_llama_dir})
        assert back.status_code == 200
    assert client.completions.create(**ASK).choices[0].text == before
    assert httpx.post(server.url + "/update_weights_from_disk", timeout=30).status_code == 401


def test_sleep_while_a_stream_runs_is_409_and_the_stream_goes_on(server):
    body = {**ASK, "max_tokens": 300, "stream": True, "ignore_eos": True}
    del body["extra_body"]
    with _http(server) as http, http.stream("POST", "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        busy = http.post("/sleep")
        assert busy.status_code == 409, busy.text
        assert "request(s) are unfinished" in busy.json()["error"]["message"]
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert not server.state.engine.is_sleeping


def test_without_their_flags_the_optional_routes_do_not_exist(tiny_llama_dir):
    with in_process_server(tiny_llama_dir, "tiny", kv_cache_memory=16 << 20,
                           max_model_len=512) as server:
        assert httpx.post(server.url + "/sleep", timeout=30).status_code == 404
        assert httpx.get(server.url + "/is_sleeping", timeout=30).status_code == 404
        assert httpx.post(server.url + "/update_weights_from_disk",
                          timeout=30).status_code == 404
        # --enable-tokenizer-info-endpoint's (test_vllm_flags.py serves it)
        assert httpx.get(server.url + "/tokenizer_info", timeout=30).status_code == 404
        assert "tokenmill_engine_sleeping" not in httpx.get(server.url + "/metrics",
                                                            timeout=30).text
