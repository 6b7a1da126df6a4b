"""Hostile request bodies: out-of-range seeds, lax types, non-text content parts. Each is a 400
naming the field, never a 5xx; an unexpected error is a 500 in OpenAI's shape, not plain text."""

from __future__ import annotations

import httpx
import openai
import pytest

from tokenmill.engine import SamplingParams
from tokenmill.engine.core.sampling_params import SamplingParamsError

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client(tiny_server):
    return tiny_server.client


def _bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    assert info.value.status_code == 400
    return info.value.body  # the client's view of {"error": {...}}: its inner object


@pytest.mark.parametrize("seed", [2**70, 2**63, -(2**63) - 1])
def test_a_seed_beyond_64_bits_is_a_400_naming_seed(client, seed):
    error = _bad_request(lambda: client.completions.create(
        model="tiny", prompt="Hi", max_tokens=2, seed=seed))
    assert error["param"] == "seed" and error["message"].startswith("seed: ")


def test_the_64_bit_extremes_serve_every_choice(client):
    # Sequence i is seeded with seed + 7919 * i: near the top of the range that used to pass
    # torch's generator bound in the engine loop, killing it for every request.
    for seed in (2**63 - 1, -(2**63)):
        r = client.completions.create(model="tiny", prompt="Hi", max_tokens=3, n=3, seed=seed,
                                      temperature=1.0, extra_body={"ignore_eos": True})
        assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices


def test_sampling_params_bound_the_seed_too():
    with pytest.raises(SamplingParamsError, match="seed"):
        SamplingParams(seed=2**64 - 1)
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


LAX = [
    # (field, value) pairs pydantic's lax mode would coerce; OpenAI rejects them.
    ("max_tokens", "5"), ("max_tokens", True), ("max_tokens", 5.0), ("n", "2"), ("n", True),
    ("stream", "yes"), ("stream", 1), ("echo", "true"), ("ignore_eos", 0),
    ("temperature", "0.5"), ("temperature", True), ("top_p", "1"), ("top_k", "3"),
    ("seed", "42"), ("seed", 4.0), ("logprobs", "2"), ("stop", 5), ("stop", [5]),
    ("stop_token_ids", ["2"]), ("user", 7), ("model", 1), ("prompt", True), ("prompt", [True]),
    ("stream_options", {"include_usage": "yes"}), ("cache_salt", 1),
]


@pytest.mark.parametrize("field,value", LAX)
def test_lax_types_are_a_400_naming_the_field(client, field, value):
    body = {"stream": True} if field == "stream_options" else {}
    body[field] = value
    extra = {k: v for k, v in body.items() if k not in ("model", "prompt")}
    error = _bad_request(lambda: client.completions.create(
        model=body.get("model", "tiny"), prompt=body.get("prompt", "Hi"), max_tokens=2,
        extra_body=extra))
    assert error["param"] == field, error
    assert error["message"].startswith(f"{field}: "), error


@pytest.mark.parametrize("field,value", [
    ("logprobs", "true"), ("top_logprobs", "2"), ("max_completion_tokens", "3"),
    ("messages", [{"role": "user", "content": 5}]), ("messages", [{"role": 1, "content": "x"}]),
])
def test_lax_chat_types_are_a_400_naming_the_field(client, field, value):
    body = {"messages": USER, field: value}
    error = _bad_request(lambda: client.chat.completions.create(
        model="tiny", max_tokens=2, messages=body.pop("messages"), extra_body=body))
    assert error["param"] == field, error


def test_floats_take_json_integers_like_openai(client):
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=2, temperature=0,
                                  top_p=1, presence_penalty=1, frequency_penalty=-1)
    assert r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("path,body", [
    # Python's json module reads these; they are not JSON (RFC 8259).
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "top_p": NaN}'),
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "temperature": -Infinity}'),
    # A lone surrogate escape: text no encoder can write (the tokenizer raised on it).
    ("/v1/completions", '{"prompt": "Hi \\ud800", "max_tokens": 2}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}]}'),
    ("/tokenize", '{"prompt": "\\ud800"}'),
    # Not UTF-8.
    ("/v1/completions", b'{"prompt": "\xff", "max_tokens": 2}'),
])
def test_what_is_not_json_is_a_400(tiny_server, path, body):
    url = tiny_server.url
    r = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("the request body is not valid JSON: ")
    paired = httpx.post(f"{url}/tokenize", content='{"prompt": "\\ud83d\\ude00"}',
                        headers={"content-type": "application/json"})
    assert paired.status_code == 200  # a surrogate pair is one character, and fine


def test_an_image_for_a_model_that_reads_text_only_is_a_400(client):
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    for stream in (False, True):
        error = _bad_request(lambda stream=stream: client.chat.completions.create(
            model="tiny", max_tokens=2, stream=stream,
            messages=[{"role": "user", "content": content}]))
        assert error["param"] == "messages"
        assert "reads text only" in error["message"]


@pytest.mark.parametrize("part", [
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    {"type": "file", "file": {"file_id": "f"}},
])
def test_a_non_text_content_part_is_a_400_naming_its_type(client, part):
    for stream in (False, True):
        content = [{"type": "text", "text": "What is this?"}, part]
        error = _bad_request(lambda content=content, stream=stream: client.chat.completions.create(
            model="tiny", max_tokens=2, stream=stream,
            messages=[{"role": "user", "content": content}]))
        assert error["param"] == "messages"
        assert repr(part["type"]) in error["message"] and "not supported" in error["message"]


def test_text_parts_are_joined(client):
    whole = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "Hello there"}])
    parts = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                               {"type": "text", "text": " there"}]}])
    assert parts.choices[0].message.content == whole.choices[0].message.content
    assert parts.usage.prompt_tokens == whole.usage.prompt_tokens
    error = _bad_request(lambda: client.chat.completions.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": [{"type": "text"}]}]))
    assert error["param"] == "messages" and "text" in error["message"]


def test_an_unexpected_error_is_a_json_500_with_the_request_id(tiny_server, monkeypatch):
    url, state = tiny_server.url, tiny_server.state

    def broken(*args, **kwargs):
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(state.tokenizer, "encode", broken)
    r = httpx.post(f"{url}/tokenize", json={"prompt": "Hi"}, headers={"X-Request-Id": "boom-1"})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == "internal_server_error" and "boom-1" in error["message"]
    assert "exploded" not in error["message"]  # the cause goes to the log, not the client
    assert r.headers["x-request-id"] == "boom-1"
    monkeypatch.undo()
    assert httpx.post(f"{url}/tokenize", json={"prompt": "Hi"}).status_code == 200
