"""vLLM's use_beam_search on /v1/completions and /v1/chat/completions: the n choices are the
offline LLM.beam_search's hypotheses over the same model, best first, whole or streamed; what
beam search cannot honour is a 400 naming the field; a client that leaves mid-search leaves
nothing running."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from server_support import stream_chunks, wait_idle

from tokenmill.engine import BeamSearchParams

MESSAGES = [{"role": "user", "content": "Name three rivers of Europe."}]
BEAM = {"use_beam_search": True}


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=120)


def _chunks(server, path: str, body: dict) -> list[dict]:
    return stream_chunks(server.url, path, {"model": "tiny", **body})


def test_completion_choices_are_the_offline_hypotheses(tiny_server, tiny_llama):
    prompts = [[1, 450, 7314, 310], [1, 9038, 2501]]
    reply = tiny_server.client.completions.create(
        model="tiny", prompt=prompts, n=3, max_tokens=8,
        extra_body={**BEAM, "return_token_ids": True, "length_penalty": 0.5})
    offline = tiny_llama.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=8,
                                                               length_penalty=0.5))
    assert [c.index for c in reply.choices] == list(range(6))
    for i, (prompt, output) in enumerate(zip(prompts, offline, strict=True)):
        choices = reply.choices[3 * i:3 * i + 3]
        want = [seq.tokens[len(prompt):] for seq in output.sequences]
        assert [c.token_ids for c in choices] == want
        assert [c.text for c in choices] == [
            tiny_llama.tokenizer.decode(ids, skip_special_tokens=True) for ids in want]
        assert [c.finish_reason for c in choices] == [s.finish_reason for s in output.sequences]
    assert reply.usage.completion_tokens == sum(len(c.token_ids) for c in reply.choices)
    assert reply.usage.prompt_tokens == sum(len(p) for p in prompts)


def test_chat_streamed_and_whole_agree_and_logprobs_add_up(tiny_server):
    body = {"messages": MESSAGES, "n": 2, "max_tokens": 10, "logprobs": True,
            "top_logprobs": 2, "stream_options": {"include_usage": True}, **BEAM}
    whole = _post(tiny_server, "/v1/chat/completions",
                  {k: v for k, v in body.items() if k != "stream_options"}).json()
    chunks = _chunks(tiny_server, "/v1/chat/completions", body)
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (
                choice["delta"].get("content") or "")
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    ranked = []
    for choice in whole["choices"]:
        content = choice["logprobs"]["content"]
        for token in content:
            assert len(token["top_logprobs"]) == 2
            assert token["logprob"] <= token["top_logprobs"][0]["logprob"]
        ranked.append(sum(token["logprob"] for token in content) / len(content))
    assert ranked == sorted(ranked, reverse=True)  # best first (length penalty 1)


@pytest.mark.parametrize("extra,field", [
    ({"stop": ["."]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"5": 3}}, "logit_bias"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "tool_choice": "required"}, "tool_choice"),
    ({"n": 20}, "n"),  # ranks 20 + the end tokens per token, past --max-logprobs' 20
    ({"max_tokens": 500}, "messages"),
])
def test_what_beam_search_cannot_honour_is_a_400_naming_the_field(tiny_server, extra, field):
    with pytest.raises(openai.BadRequestError) as caught:
        tiny_server.client.chat.completions.create(
            model="tiny", messages=MESSAGES, n=extra.pop("n", 2),
            max_tokens=extra.pop("max_tokens", 4), extra_body={**BEAM}, **extra)
    assert caught.value.body["param"] == field
    assert "use_beam_search" in caught.value.body["message"] or field in ("n", "messages")
    wait_idle(tiny_server.state)


def test_echo_with_logprobs_is_refused_and_echo_alone_works(tiny_server):
    refused = _post(tiny_server, "/v1/completions", {"prompt": "Hello", "echo": True,
                                                     "logprobs": 1, "n": 2, **BEAM})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "echo"
    echoed = _post(tiny_server, "/v1/completions", {"prompt": "Hello", "echo": True, "n": 2,
                                                    "max_tokens": 3, **BEAM}).json()
    assert all(c["text"].startswith("Hello") for c in echoed["choices"])


def test_a_client_leaving_mid_search_leaves_nothing_running(tiny_server, monkeypatch):
    state = tiny_server.state
    rounds = []  # each round's engine requests are admitted in one call
    admit = state.engine.add_requests

    async def counted(requests):
        rounds.append(len(requests))
        return await admit(requests)

    monkeypatch.setattr(state.engine, "add_requests", counted)
    body = {"model": "tiny", "messages": MESSAGES, "n": 4, "max_tokens": 80,
            "ignore_eos": True, "stream": True, **BEAM}
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", f"{tiny_server.url}/v1/chat/completions", json=body) as response:
        first = next(line for line in response.iter_lines() if line)
        assert first.startswith("data: ") and rounds  # the first round was admitted
    wait_idle(state)
    started = len(rounds)
    for _ in range(20):  # and it stays idle: no further round is started
        time.sleep(0.05)
        assert not state.engine.engine.has_unfinished_requests() and not state.engine.num_requests
    assert len(rounds) == started < 80  # the search stopped short of its 80 rounds
    state.engine.engine.kv.allocator.check_all_free()
    # Other requests are served after it.
    reply = tiny_server.client.chat.completions.create(model="tiny", messages=MESSAGES,
                                                       max_tokens=3)
    assert reply.choices[0].message.content is not None
