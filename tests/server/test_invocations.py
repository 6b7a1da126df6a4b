"""SageMaker's POST /invocations (vLLM's): a body is answered as its own route answers it,
the route chosen by its fields and by what the model serves; a body no route takes is a 400
naming what it needs."""

from __future__ import annotations

import httpx
import pytest

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6,
        "temperature": 0}
COMPLETION = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}


def _post(server, path: str, body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize(("body", "route", "kind"), [
    (CHAT, "/v1/chat/completions", "chat.completion"),
    (COMPLETION, "/v1/completions", "text_completion")])
def test_a_generative_models_invocation_is_its_chat_or_completion(tiny_server, body, route,
                                                                  kind):
    invoked, direct = _post(tiny_server, "/invocations", body), _post(tiny_server, route, body)
    assert invoked.status_code == 200, invoked.text
    assert invoked.json()["object"] == direct.json()["object"] == kind
    assert invoked.json()["choices"] == direct.json()["choices"]


def test_a_streamed_invocation_streams(tiny_server):
    with httpx.stream("POST", tiny_server.url + "/invocations", json={**CHAT, "stream": True},
                      timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 2


def test_a_body_that_is_not_json_is_a_400(tiny_server):
    for content in (b"", b"{", b'{"prompt": NaN}'):
        reply = httpx.post(tiny_server.url + "/invocations", content=content, timeout=60,
                           headers={"Content-Type": "application/json"})
        assert reply.status_code == 400, reply.text
        assert "not valid JSON" in reply.json()["error"]["message"]


@pytest.mark.parametrize(("body", "says", "param"), [
    ({"input": "a"}, "takes a chat completion's body (messages) or a completion's (prompt)",
     None),
    ([1, 2], "the request body must be a JSON object", None),
    ({"messages": "hi"}, "messages", "messages"),
    ({"prompt": "a", "max_tokens": -1}, "max_tokens", "max_tokens")])
def test_a_body_no_route_takes_is_a_400(tiny_server, body, says, param):
    reply = _post(tiny_server, "/invocations", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert says in error["message"] and error["param"] == param
    assert _post(tiny_server, "/invocations", COMPLETION).status_code == 200
