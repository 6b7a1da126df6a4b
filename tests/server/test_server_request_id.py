"""X-Request-Id: the client's is echoed and tags the request's log lines; else one is made."""

from __future__ import annotations

import io
import logging
import re
import time

import openai
import pytest

from tokenmill.engine.log import LogfmtFormatter

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client(tiny_server):
    return tiny_server.client


@pytest.fixture
def server_log():
    """The server's log lines as tokenmill writes them (it runs in this process)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogfmtFormatter())
    logger = logging.getLogger("tokenmill")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _logged(server_log: io.StringIO, text: str) -> str:
    """The first line with `text`; the line that closes a request comes once the server has
    sent its last byte, which may be after the client has read it."""
    deadline = time.monotonic() + 10
    while True:
        found = [line for line in server_log.getvalue().splitlines() if text in line]
        if found:
            return found[0]
        assert time.monotonic() < deadline, server_log.getvalue()
        time.sleep(0.02)


def test_a_client_request_id_is_echoed_and_logged(client, server_log):
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="Hi", max_tokens=2, extra_headers={"X-Request-Id": "req-abc-1"})
    assert raw.headers["x-request-id"] == "req-abc-1"
    assert raw.parse().choices
    admitted = _logged(server_log, 'msg="request admitted"')
    assert "id=cmpl-" in admitted and admitted.endswith("request_id=req-abc-1")
    done = _logged(server_log, "msg=request ")
    assert "status=200" in done and done.endswith("request_id=req-abc-1")


def test_a_streamed_request_keeps_its_id(client, server_log):
    with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=USER, max_tokens=3, stream=True,
            extra_headers={"X-Request-Id": "stream-7"}) as response:
        assert response.headers["x-request-id"] == "stream-7"
        assert list(response.iter_lines())
    line = _logged(server_log, "path=/v1/chat/completions status=200")
    assert line.endswith("request_id=stream-7")


def test_without_one_the_server_makes_one_per_request(client):
    first = client.models.with_raw_response.list().headers["x-request-id"]
    second = client.models.with_raw_response.list().headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", first) and first != second


def test_errors_carry_the_id_too(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="Hi", max_tokens=0,
                                  extra_headers={"X-Request-Id": "bad-1"})
    assert info.value.response.headers["x-request-id"] == "bad-1"
    assert info.value.request_id == "bad-1"  # the client reads the same header


def test_a_quote_in_the_id_cannot_forge_log_fields(client, server_log):
    client.models.list(extra_headers={"X-Request-Id": 'x" level="error'})
    assert _logged(server_log, "msg=request ").endswith('request_id="x\\" level=\\"error"')
