"""vLLM's --default-chat-template-kwargs: variables every chat request's template gets (Qwen3's
enable_thinking false, say), unless the request's chat_template_kwargs sets them; the rendered
prompt is what runs, so /tokenize shows it."""

from __future__ import annotations

import httpx
import pytest
from server_support import in_process_server

# A template that writes its variables, so the prompt shows which values it got.
TEMPLATE = ("{{ 'thinking=' ~ enable_thinking ~ ' style=' ~ (style or 'none') ~ '\\n' }}"
            "{% for m in messages %}{{ m.content }}\\n{% endfor %}")
ASK = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    options = {"chat_template": TEMPLATE,
               "default_chat_template_kwargs": {"enable_thinking": False, "style": "terse"}}
    with in_process_server(tiny_llama_dir, "tiny", options=options,
                           max_model_len=128) as server:
        yield server


def _rendered(server, body: dict) -> str:
    tokens = httpx.post(server.url + "/tokenize", json={"messages": ASK, **body},
                        timeout=60).json()["tokens"]
    return server.state.tokenizer.decode(tokens)


def test_the_servers_variables_reach_every_template_unless_the_request_sets_them(server):
    assert _rendered(server, {}).startswith("thinking=False style=terse\n")
    overridden = _rendered(server, {"chat_template_kwargs": {"enable_thinking": True}})
    assert overridden.startswith("thinking=True style=terse\n")


def test_a_chat_completion_runs_the_rendered_prompt(server):
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": ASK, "max_tokens": 2, "return_token_ids": True}).json()
    expected = httpx.post(server.url + "/tokenize", json={"messages": ASK},
                          timeout=60).json()["tokens"]
    assert reply["prompt_token_ids"] == expected
