"""vLLM's per-request chat_template and documents: a request's own template renders its
messages only on a server started with --trust-request-chat-template, and is refused with a
400 naming the field otherwise; a template that does not parse is a 400; a retrieval
template reads the request's documents."""

from __future__ import annotations

import httpx
import pytest

from tokenmill.engine.contract.server_flags import add_server_arguments

TEMPLATE = ("{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
            "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% for d in documents or [] %}<doc {{ d['title'] }}>{{ d['text'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
MESSAGES = [{"role": "user", "content": "Where is the Seine?"}]
DOCUMENTS = [{"title": "rivers", "text": "The Seine flows through Paris."}]


@pytest.fixture
def trusting(tiny_server):
    tiny_server.state.options.trust_request_chat_template = True
    yield tiny_server
    tiny_server.state.options.trust_request_chat_template = False


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)


def _encoded(server, text: str) -> list[int]:
    return server.state.tokenizer.encode(text, add_special_tokens=False)


def test_a_trusted_requests_template_and_documents_render_its_messages(trusting):
    body = {"messages": MESSAGES, "chat_template": TEMPLATE, "documents": DOCUMENTS}
    rendered = ("[user] Where is the Seine?\n<doc rivers>The Seine flows through Paris.\n"
                "[assistant]")
    tokens = _post(trusting, "/tokenize", body).json()["tokens"]
    assert tokens == _encoded(trusting, rendered)
    reply = _post(trusting, "/v1/chat/completions", {**body, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(tokens)
    # The server's own template is untouched for the next request.
    plain = _post(trusting, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert plain == _encoded(trusting, trusting.state.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False))


def test_reasoning_effort_reaches_the_template_from_chat_and_responses(trusting):
    def prompt_text(path: str, body: dict) -> str:
        reply = _post(trusting, path, {"chat_template": TEMPLATE, "max_tokens": 1,
                                       "return_token_ids": True, **body})
        assert reply.status_code == 200, reply.text
        return trusting.state.tokenizer.decode(reply.json()["prompt_token_ids"])

    chat = {"messages": MESSAGES}
    assert prompt_text("/v1/chat/completions", {**chat, "reasoning_effort": "low"}
                       ).startswith("Reasoning: low\n[user]")
    assert prompt_text("/v1/chat/completions", {
        **chat, "reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}
    ).startswith("Reasoning: high\n")
    assert prompt_text("/v1/chat/completions", chat).startswith("[user]")
    shell = _post(trusting, "/v1/responses", {"input": "Where is the Seine?",
                                              "reasoning": {"effort": "medium"},
                                              "chat_template": TEMPLATE,
                                              "max_output_tokens": 1})
    assert shell.status_code == 200, shell.text
    assert shell.json()["reasoning"]["effort"] == "medium"
    assert shell.json()["usage"]["input_tokens"] == len(_encoded(
        trusting, "Reasoning: medium\n[user] Where is the Seine?\n[assistant]"))


def test_an_untrusting_server_refuses_a_requests_template(tiny_server):
    for path in ("/v1/chat/completions", "/tokenize"):
        reply = _post(tiny_server, path, {"messages": MESSAGES, "chat_template": TEMPLATE})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == "chat_template"
        assert "--trust-request-chat-template" in error["message"]


def test_a_template_that_does_not_parse_is_a_400_naming_it(trusting):
    reply = _post(trusting, "/v1/chat/completions",
                  {"messages": MESSAGES, "chat_template": "{% for m in messages %}"})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "chat_template"
    assert "does not parse" in reply.json()["error"]["message"]


def test_the_flag_is_off_unless_given():
    import argparse

    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    assert parser.parse_args([]).trust_request_chat_template is False
    assert parser.parse_args(["--trust-request-chat-template"]).trust_request_chat_template
