"""vLLM's serving options: --max-logprobs (the most log-probabilities per token a request may
ask for, -1 the vocabulary), --enable-force-include-usage (every stream ends with its usage)
and --root-path (served under a proxy's path prefix, which requests may carry or not)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from server_support import in_process_server

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.core.errors import RequestError


@pytest.fixture(scope="module")
def wide_logprobs(tiny_llama_dir):
    """Up to 40 log-probabilities per token, every stream with its usage, under /llm."""
    with in_process_server(tiny_llama_dir, "tiny", max_model_len=128, max_logprobs=40,
                           options={"force_include_usage": True, "root_path": "/llm",
                                    "api_key": "sk-test"}) as server:
        yield server


def _client(server, prefix: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}{prefix}/v1", api_key="sk-test")


@pytest.mark.parametrize("prefix", ["", "/llm"])
def test_logprobs_up_to_the_servers_limit_are_answered(wide_logprobs, prefix):
    client = _client(wide_logprobs, prefix)
    completion = client.completions.create(model="tiny", prompt="one two", max_tokens=2,
                                           logprobs=40, extra_body={"prompt_logprobs": 40})
    assert all(len(top) == 40 for top in completion.choices[0].logprobs.top_logprobs)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        logprobs=True, top_logprobs=33)
    assert all(len(t.top_logprobs) == 33 for t in chat.choices[0].logprobs.content)


@pytest.mark.parametrize(("body", "field"), [
    ({"prompt": "x", "logprobs": 41}, "logprobs"),
    ({"prompt": "x", "prompt_logprobs": 41}, "prompt_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 41},
     "top_logprobs"),
])
def test_more_than_the_limit_is_a_400_naming_the_field(wide_logprobs, body, field):
    route = "completions" if "prompt" in body else "chat/completions"
    reply = httpx.post(f"{wide_logprobs.url}/v1/{route}", timeout=60,
                       headers={"Authorization": "Bearer sk-test"},
                       json={"model": "tiny", "max_tokens": 1, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field
    assert "more than the 40 --max-logprobs allows" in error["message"]


def test_every_stream_ends_with_its_usage(wide_logprobs):
    chunks = list(_client(wide_logprobs).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        stream=True, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])


def test_load_counts_the_calls_in_flight(wide_logprobs):
    """vLLM's GET /load: 1 while a stream is open, 0 once it has ended; open, as /metrics."""
    assert httpx.get(wide_logprobs.url + "/load", timeout=10).json() == {"server_load": 0}
    stream = _client(wide_logprobs).completions.create(
        model="tiny", prompt="hi", max_tokens=50, stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    assert httpx.get(wide_logprobs.url + "/load", timeout=10).json() == {"server_load": 1}
    for _ in stream:
        pass
    deadline = time.monotonic() + 10
    while httpx.get(wide_logprobs.url + "/load", timeout=10).json()["server_load"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_under_the_root_path_probes_stay_open_and_the_docs_name_it(wide_logprobs):
    for path in ("/health", "/llm/health", "/llm/metrics"):
        assert httpx.get(wide_logprobs.url + path, timeout=10).status_code == 200, path
    assert httpx.get(wide_logprobs.url + "/llm/v1/models", timeout=10).status_code == 401
    spec = httpx.get(wide_logprobs.url + "/llm/openapi.json", timeout=10).json()
    assert spec["servers"] == [{"url": "/llm"}]


def test_the_engine_holds_offline_requests_to_the_limit_too(tiny_llama_dir):
    with LLM(tiny_llama_dir, show_progress=False, max_logprobs=-1) as llm:
        vocab = llm.engine.model_config.vocab_size
        out = llm.generate([[100, 200]], SamplingParams(max_tokens=1, logprobs=vocab))[0]
        assert len(out.outputs[0].logprobs[0]) >= vocab
        with pytest.raises(RequestError, match=f"more than the {vocab} --max-logprobs"):
            llm.generate([[100]], SamplingParams(max_tokens=1, prompt_logprobs=vocab + 1))
    with pytest.raises(ConfigError, match="max_logprobs: must be -1"):
        EngineConfig(max_logprobs=-2)
