"""`tokenmill chat` and `tokenmill complete` against a real server over HTTP: a quick message's
reply is the chat completion's, an interactive chat sends each message after the
conversation so far, a completion prints the prompt's continuation, and what goes wrong ends
the command with one line and exit status 1."""

from __future__ import annotations

import io

import pytest

from tokenmill.engine.cli import main

GREEDY = ["--temperature", "0", "--max-tokens", "6"]


def test_a_quick_message_prints_the_reply(tiny_server, capsys):
    assert main(["chat", "--url", f"{tiny_server.url}/v1", "-q", "one two", *GREEDY,
                 "--system-prompt", "three"]) == 0
    printed = capsys.readouterr().out
    reply = tiny_server.client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=6,
        messages=[{"role": "system", "content": "three"}, {"role": "user", "content": "one two"}])
    assert printed == reply.choices[0].message.content + "\n"


def test_a_chat_keeps_the_conversation(tiny_server, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("one\n\ntwo\n"))
    assert main(["chat", "--url", f"{tiny_server.url}/v1", "--model-name", "tiny",
                 *GREEDY]) == 0
    first, second = capsys.readouterr().out.split("\n")[:2]
    client = tiny_server.client
    asked = [{"role": "user", "content": "one"}]
    answer = client.chat.completions.create(model="tiny", temperature=0, max_tokens=6,
                                            messages=asked).choices[0].message.content
    assert first.endswith(answer)  # after the prompt "> "
    again = client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=6,
        messages=[*asked, {"role": "assistant", "content": answer},
                  {"role": "user", "content": "two"}]).choices[0].message.content
    assert second.endswith(again)


def test_complete_prints_the_continuation(tiny_server, capsys):
    assert main(["complete", "--url", f"{tiny_server.url}/v1", "-q", "one two",
                 *GREEDY]) == 0
    text = tiny_server.client.completions.create(model="tiny", prompt="one two",
                                                 temperature=0, max_tokens=6).choices[0].text
    assert capsys.readouterr().out == text + "\n"


@pytest.mark.parametrize(("extra", "says"), [
    (["--model-name", "nope"], "the server answered 404: the model 'nope' does not exist"),
    (["--max-tokens", "100000"], "the server answered 400: "),
])
def test_a_refused_request_is_one_line(tiny_server, capsys, extra, says):
    assert main(["chat", "--url", f"{tiny_server.url}/v1", "-q", "hi", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokenmill chat: error: " + says) and err.count("\n") == 1


def test_an_unreachable_server_is_one_line(capsys):
    assert main(["complete", "--url", "http://127.0.0.1:9/v1", "-q", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokenmill complete: error: can't reach http://127.0.0.1:9/v1")
    assert err.count("\n") == 1
