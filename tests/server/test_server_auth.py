"""--api-key / TOKENMILL_API_KEY: a Bearer key on the API, 401 in OpenAI's shape without it,
probes and metrics open."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest
from server_support import ServeProcess, openai_client

KEY = "tm-test-key-0123456789"


@pytest.fixture
def keyed(tiny_server):
    url, state = tiny_server.url, tiny_server.state
    state.options.api_key = KEY
    try:
        yield url
    finally:
        state.options.api_key = None


def test_the_official_client_works_with_the_key_and_raises_without(keyed):
    good = openai_client(f"{keyed}/v1", KEY)
    assert [m.id for m in good.models.list()] == ["tiny"]
    assert good.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices
    chunks = list(good.chat.completions.create(model="tiny", max_tokens=2, stream=True,
                                               messages=[{"role": "user", "content": "Hi"}]))
    assert chunks[-1].choices[0].finish_reason is not None
    bad = openai_client(f"{keyed}/v1", KEY + "x")
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert info.value.status_code == 401
    assert info.value.body == {"message": "Incorrect API key provided.",
                               "type": "invalid_request_error", "param": None,
                               "code": "invalid_api_key"}
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize("header", [None, "", "Bearer", f"Basic {KEY}", KEY])
def test_a_missing_key_is_openais_401(keyed, header):
    headers = {} if header is None else {"Authorization": header}
    r = httpx.post(f"{keyed}/v1/completions", json={"prompt": "Hi"}, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["message"].startswith("You didn't provide an API key.")


def test_the_scheme_is_case_insensitive(keyed):
    r = httpx.get(f"{keyed}/v1/models", headers={"Authorization": f"bearer {KEY}"})
    assert r.status_code == 200


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
    ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/v1/nothing"),
    ("POST", "/tokenize/"), ("GET", "/anything-else"),
])
def test_every_api_path_needs_the_key(keyed, method, path):
    r = httpx.request(method, keyed + path, json={})
    assert r.status_code == 401, (path, r.text)


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics", "/version", "/openapi.json"])
def test_probes_metrics_and_version_stay_open(keyed, path):
    assert httpx.get(keyed + path).status_code == 200


def test_ping_answers_as_health(keyed):
    """vLLM's /ping (SageMaker's probe), by GET or POST."""
    health = httpx.get(keyed + "/health").json()
    assert httpx.get(keyed + "/ping").json() == health == {"status": "ok"}
    assert httpx.post(keyed + "/ping").json() == health


def test_a_key_for_tokenize_through_the_official_client(keyed):
    root = openai_client(keyed, KEY)
    assert root.post("/tokenize", body={"prompt": "Hi"}, cast_to=object)["count"] >= 1
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, "nope").post(
            "/tokenize", body={"prompt": "Hi"}, cast_to=object)


@pytest.mark.parametrize("flags,env,reason", [
    (["--api-key", ""], {}, "is empty"),
    ([], {"TOKENMILL_API_KEY": ""}, "is empty"),
    ([], {"TOKENMILL_API_KEY": "s3cret\n"}, "trailing newline"),
    (["--api-key", "s3cret key"], {}, "visible ASCII"),
])
def test_an_unusable_key_exits_2_without_echoing_it(flags, env, reason):
    code, stderr = ServeProcess("/nonexistent", *flags, env=env).finish()
    assert code == 2, stderr
    assert reason in stderr and "s3cret" not in stderr
    assert "--api-key" in stderr


def test_the_environment_variable_guards_a_real_server(tiny_llama_dir):
    proc = ServeProcess(tiny_llama_dir, env={"TOKENMILL_API_KEY": KEY})
    url = proc.url
    try:
        proc.wait_healthy(60)
        client = openai_client(f"{url}/v1", KEY)
        assert client.completions.create(model=tiny_llama_dir, prompt="Hi", max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai_client(f"{url}/v1", "wrong").models.list()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
