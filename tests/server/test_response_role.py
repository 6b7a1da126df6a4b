"""vLLM's --response-role: a chat reply's message (and its stream's first delta) carries that
role where the prompt asks for a reply; a request continuing its last message is answered in
that message's role, and with vLLM's echo its reply starts with that message."""

from __future__ import annotations

import json

import httpx
import pytest
from server_support import in_process_server

from tokenmill.engine.cli import parse_args
from tokenmill.engine.contract.config import engine_config_from_args
from tokenmill.engine.server.serve import server_state

ASK = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    with in_process_server(tiny_llama_dir, "tiny", options={"response_role": "bot"},
                           max_model_len=128) as server:
        yield server


def _chat(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": ASK, "max_tokens": 2, **body})


def test_a_reply_takes_the_servers_role(server):
    assert _chat(server).json()["choices"][0]["message"]["role"] == "bot"
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "messages": ASK, "max_tokens": 2, "stream": True}) as reply:
        first = next(line for line in reply.iter_lines() if line.startswith("data: {"))
    assert '"delta":{"role":"bot"' in first.replace(" ", "")


def test_a_continued_message_keeps_its_role(server):
    body = {"messages": [*ASK, {"role": "assistant", "content": "Hi"}],
            "add_generation_prompt": False, "continue_final_message": True}
    assert _chat(server, **body).json()["choices"][0]["message"]["role"] == "assistant"


def test_echo_puts_a_continued_message_before_its_continuation(server):
    """vLLM's echo: the reply's content starts with the last message's, where that message
    has the reply's role; whole or streamed (in the first delta)."""
    continued = [*ASK, {"role": "assistant", "content": "Hi there"}]
    body = {"messages": continued, "add_generation_prompt": False,
            "continue_final_message": True, "max_tokens": 4, "temperature": 0}
    plain = _chat(server, **body).json()["choices"][0]["message"]["content"]
    echoed = _chat(server, **body, echo=True).json()["choices"][0]["message"]["content"]
    assert echoed == "Hi there" + plain
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            **body, "messages": continued, "echo": True, "stream": True}) as reply:
        chunks = [json.loads(line[6:]) for line in reply.iter_lines()
                  if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c["choices"]) == echoed
    # The last message is the user's, the reply the server's role ("bot"): nothing echoed.
    asked = {"messages": ASK, "max_tokens": 4, "temperature": 0}
    assert _chat(server, **asked, echo=True).json()["choices"][0]["message"]["content"] == \
        _chat(server, **asked).json()["choices"][0]["message"]["content"]


def test_the_flag_reaches_the_servers_options():
    for flags, role in ((["--response-role", "bot"], "bot"), ([], "assistant")):
        args = parse_args(["serve", *flags])
        state = server_state(engine_config_from_args(args), args)
        assert state.options.response_role == role
