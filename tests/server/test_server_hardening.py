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


@pytest.mark.parametrize("path,body,field", [
    ("/v1/completions", {"prompt": "Hi", "top_k": 0}, "top_k"),
    ("/v1/completions", {"prompt": "Hi", "stop": ["x"] * 17}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("/v1/completions", {"prompt": "Hi", "n": 1, "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "Hi", "suffix": "!"}, "suffix"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": USER, "continue_final_message": True},
     "continue_final_message"),
    ("/tokenize", {}, "prompt"),
])
def test_checks_across_fields_are_400s_naming_the_field_at_fault(tiny_server, path, body,
                                                                  field):
    r = httpx.post(tiny_server.url + path, json={"model": "tiny", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: "), error


@pytest.mark.parametrize("stop_token_ids", [[999_999], [3, -5]])
def test_stop_token_ids_outside_the_vocabulary_are_a_400_and_the_engine_serves_on(
        client, stop_token_ids):
    """A stop id is masked while a reply is short of min_tokens, as an index into the logits:
    one past the vocabulary raised inside the engine loop, ending it for every request."""
    error = _bad_request(lambda: client.completions.create(
        model="tiny", prompt="Hi", max_tokens=4,
        extra_body={"min_tokens": 2, "stop_token_ids": stop_token_ids}))
    assert error["param"] == "stop_token_ids", error
    served = client.completions.create(model="tiny", prompt="Hi", max_tokens=4,
                                       extra_body={"min_tokens": 2, "stop_token_ids": [3]})
    assert served.usage.completion_tokens >= 2


def test_a_top_k_no_float_holds_is_served_and_the_engine_serves_on(tiny_server, client):
    """JSON integers have no bound: this top_k raised inside the engine loop, ending it."""
    body = '{"model": "tiny", "prompt": "Hi", "max_tokens": 3, "top_k": 1' + "0" * 400 + "}"
    r = httpx.post(tiny_server.url + "/v1/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices


def test_a_prompt_filling_the_context_without_max_tokens_names_the_prompts_field(client):
    """max_tokens left out is what the context leaves: nothing, for a prompt that fills it."""
    error = _bad_request(lambda: client.completions.create(
        model="tiny", prompt=[5] * 128, max_tokens=None))
    assert error["param"] == "prompt" and "maximum context length is 128" in error["message"]
    error = _bad_request(lambda: client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi " * 200}]))
    assert error["param"] == "messages", error


def test_n_is_bounded_by_openais_128(client):
    error = _bad_request(lambda: client.completions.create(
        model="tiny", prompt="Hi", max_tokens=2, n=129))
    assert error["param"] == "n" and error["message"].startswith("n: "), error
    reply = client.completions.create(model="tiny", prompt="Hi", max_tokens=2, n=40)
    assert len(reply.choices) == 40


def test_an_n_past_the_batch_is_refused_naming_n(tiny_llama_dir):
    from tokenmill.engine import LLM
    from tokenmill.engine.core.errors import RequestError

    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=4)
    with pytest.raises(RequestError, match="n=5 exceeds max_num_seqs=4") as info:
        llm.generate(["Hi"], SamplingParams(n=5, max_tokens=2))
    assert info.value.param == "n"


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
    message = r.json()["error"]["message"]
    assert message.startswith("the request body is not valid JSON: ")
    if "\\ud" in str(body) or "\\udfff" in str(body):
        assert "surrogate pair" in message, message
    paired = httpx.post(f"{url}/tokenize", content='{"prompt": "\\ud83d\\ude00"}',
                        headers={"content-type": "application/json"})
    assert paired.status_code == 200  # a surrogate pair is one character, and fine


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_a_400_naming_the_content_type(tiny_server, content_type):
    """curl's -d without -H sends a form's Content-Type, and FastAPI then reads no JSON: the
    error says what to send instead of what the request model lacks."""
    body = '{"model": "tiny", "prompt": "Hi", "max_tokens": 2}'
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(tiny_server.url + "/v1/completions", content=body, headers=headers)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "Content-Type: application/json" in message
    assert (content_type or "had none") in message
    ok = httpx.post(tiny_server.url + "/v1/completions", content=body,
                    headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text
    listed = httpx.post(tiny_server.url + "/v1/completions", content="[1, 2]",
                        headers={"content-type": "application/json"})
    assert listed.status_code == 400 and "Content-Type" not in listed.json()["error"]["message"]


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


def test_text_parts_are_joined_one_a_line(client):
    """As vLLM joins them: parts written as separate words do not run together."""
    whole = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "Say\nhi"}])
    parts = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say"},
                                               {"type": "text", "text": "hi"}]}])
    assert parts.choices[0].message.content == whole.choices[0].message.content
    assert parts.usage.prompt_tokens == whole.usage.prompt_tokens
    # An assistant's refusal part, as the openai client's types allow, is read as its text.
    refused = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[*USER, {"role": "assistant", "content": [{"type": "refusal",
                                                            "refusal": "I can't."}]}, *USER])
    written = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[*USER, {"role": "assistant", "content": "I can't."}, *USER])
    assert refused.usage.prompt_tokens == written.usage.prompt_tokens
    assert refused.choices[0].message.content == written.choices[0].message.content
    error = _bad_request(lambda: client.chat.completions.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": [{"type": "text"}]}]))
    assert error["param"] == "messages" and "text" in error["message"]


def test_a_null_is_the_default_of_a_field_that_takes_none(client):
    """The openai client sends a parameter given as None as null; OpenAI reads it as not
    given (a 400 'Input should be a valid integer' for n=None before)."""
    nulls = {"n": None, "presence_penalty": None, "frequency_penalty": None, "logprobs": None,
             "stream": None, "temperature": 0}
    chat = client.chat.completions.create(model="tiny", max_tokens=3, messages=USER, **nulls)
    plain = client.chat.completions.create(model="tiny", max_tokens=3, messages=USER,
                                           temperature=0)
    assert len(chat.choices) == 1
    assert chat.choices[0].message.content == plain.choices[0].message.content
    text = client.completions.create(model="tiny", prompt="Hi", max_tokens=3, n=None,
                                     echo=None, stream=None, presence_penalty=None)
    assert len(text.choices) == 1 and not text.choices[0].text.startswith("Hi")
    response = client.responses.create(model="tiny", input="Hi", max_output_tokens=3,
                                       parallel_tool_calls=None, stream=None)
    assert response.status in ("completed", "incomplete")
    error = _bad_request(lambda: client.chat.completions.create(
        model="tiny", max_tokens=3, messages=None))
    assert error["param"] == "messages"


def test_unknown_paths_and_methods_are_answered_in_openais_words(tiny_server, client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.create(file=("a.jsonl", b"{}"), purpose="batch")
    assert missing.value.body["message"] == "Invalid URL (POST /v1/files)"
    wrong = httpx.get(tiny_server.url + "/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    error = wrong.json()["error"]
    assert error["message"] == "Method not allowed (GET /v1/chat/completions): it takes POST"
    assert error["type"] == "invalid_request_error"


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
