"""--max-request-body-bytes: a larger body is a 413 in OpenAI's shape, decided before the body
is read, whether the client declares its length or sends it chunked."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest
from server_support import openai_client

LIMIT = 64 * 1024


@pytest.fixture
def limited(tiny_server):
    url, state = tiny_server.url, tiny_server.state
    before = state.options.max_request_body_bytes
    state.options.max_request_body_bytes = LIMIT
    try:
        yield url
    finally:
        state.options.max_request_body_bytes = before


def _is_413(error: dict) -> None:
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert str(LIMIT) in error["message"] and "--max-request-body-bytes" in error["message"]


def test_the_official_client_gets_413_for_a_large_prompt(limited):
    client = openai_client(f"{limited}/v1")
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="tiny", prompt="a" * (LIMIT + 1), max_tokens=2)
    assert info.value.status_code == 413
    _is_413(info.value.body)
    # A body just under the limit is read and served (a 400 for its length, not a 413).
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="a " * (LIMIT // 2 - 100), max_tokens=2)
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices


def test_a_chunked_body_is_cut_off_at_the_limit(limited):
    sent = []

    def chunks():
        for _ in range(64):  # 4x the limit, 4 KiB at a time
            sent.append(4096)
            yield b"x" * 4096

    r = httpx.post(f"{limited}/v1/completions", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "content-length" not in r.request.headers
    _is_413(r.json()["error"])
    small = httpx.post(f"{limited}/v1/completions", headers={"content-type": "application/json"},
                       content=iter([b'{"prompt": "Hi", ', b'"max_tokens": 2}']))
    assert small.status_code == 200, small.text


def test_a_declared_length_over_the_limit_is_answered_before_any_body(limited):
    host, port = limited.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n")
        start = time.monotonic()
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 ") and time.monotonic() - start < 5
