"""POST /v1/responses over real HTTP with the official openai client: the same reply as the
equivalent chat completion, whole and as the Responses API's events (the client's own stream
helper assembles them), structured text and function calls, the thinking as a reasoning item,
and 400s naming the Responses field. The agent model is scripted (tool_support.py): greedy
decoding thinks, says a sentence and calls two tools, in pieces that split every tag."""

from __future__ import annotations

import json
import time
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel
from server_support import in_process_server
from tool_support import HERMES_REPLY, HERMES_SPECIAL, HERMES_TEMPLATE, make_scripted_model

THINKING = ["<thi", "nk>Two look", "ups.</thi", "nk>\n\n"]
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "days": {"type": "integer"}},
                          "required": ["city"]}}
TIME = {"type": "function", "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
ASK = "Weather in Paris, and the time in CET?"


@pytest.fixture(scope="module")
def agent(tmp_path_factory, smol_tokenizer):
    directory = make_scripted_model(str(tmp_path_factory.mktemp("agent")), smol_tokenizer,
                                    HERMES_TEMPLATE, THINKING + HERMES_REPLY, HERMES_SPECIAL)
    options = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes",
               "reasoning_parser": "qwen3"}
    with in_process_server(directory, "agent", options=options, max_num_seqs=4) as server:
        yield server


def shape(output) -> list[tuple]:
    """Output items without their random ids."""
    items = []
    for item in output:
        if item.type == "reasoning":
            items.append(("reasoning", [c.text for c in item.content]))
        elif item.type == "message":
            items.append(("message", [c.text for c in item.content], item.status))
        else:
            items.append(("function_call", item.name, json.loads(item.arguments)))
    return items


EXPECTED = [("reasoning", ["Two lookups."]),
            ("message", ["Let me check.\n"], "completed"),
            ("function_call", "get_weather", {"city": "Paris", "days": 3}),
            ("function_call", "get_time", {"zone": "CET"})]


def test_thinking_text_and_calls_are_output_items(agent):
    response = agent.client.responses.create(model="agent", input=ASK, tools=[WEATHER, TIME],
                                             temperature=0)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.incomplete_details is None
    assert shape(response.output) == EXPECTED
    calls = [item for item in response.output if item.type == "function_call"]
    assert all(c.call_id.startswith("call_") and c.status == "completed" for c in calls)
    assert len({c.call_id for c in calls} | {c.id for c in calls}) == 4
    chat = agent.client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": ASK}],
        tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
               for t in (WEATHER, TIME)], temperature=0)
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens
    assert response.usage.output_tokens_details.reasoning_tokens > 0


def test_the_stream_builds_the_same_items(agent):
    events = list(agent.client.responses.create(model="agent", input=ASK, tools=[WEATHER, TIME],
                                                temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final.type == "response.completed"
    assert shape(final.response.output) == EXPECTED
    # Every item's deltas join to its finished text. How many deltas depends on how far the
    # event loop is behind the engine (a chunk then carries several tokens): the pieces the
    # translation makes of each chunk are test_responses_translation.py's.
    pieces = []
    for item in final.response.output:
        deltas = [e.delta for e in events if getattr(e, "item_id", None) == item.id
                  and e.type.endswith(".delta")]
        whole = item.arguments if item.type == "function_call" else item.content[0].text
        assert "".join(deltas) == whole
        pieces.append(len(deltas))
    assert all(n >= 1 for n in pieces)
    with agent.client.responses.stream(model="agent", input=ASK, tools=[WEATHER, TIME],
                                       temperature=0) as stream:
        assembled = stream.get_final_response()
    assert shape(assembled.output) == EXPECTED


def test_a_call_and_its_output_sent_back_are_the_conversation(agent):
    """A function call and its output as input items reach the template as the chat
    conversation with the assistant's tool call and the tool's result does."""
    arguments = json.dumps({"city": "Paris"})
    response = agent.client.responses.create(model="agent", max_output_tokens=2, input=[
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}])
    chat = agent.client.chat.completions.create(model="agent", max_tokens=2, messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])
    shorter = agent.client.responses.create(model="agent", input=ASK, max_output_tokens=2)
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.input_tokens > shorter.usage.input_tokens + 10


# ---- on the tiny random model -------------------------------------------------------------

def test_greedy_text_equals_the_chat_completions(tiny_server):
    client = tiny_server.client
    for max_tokens in (3, 40):
        response = client.responses.create(model="tiny", instructions="Be brief.", input=ASK,
                                           temperature=0, max_output_tokens=max_tokens)
        chat = client.chat.completions.create(
            model="tiny", temperature=0, max_tokens=max_tokens,
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": ASK}])
        assert response.output_text == chat.choices[0].message.content
        assert response.usage.input_tokens == chat.usage.prompt_tokens
        assert response.usage.output_tokens == chat.usage.completion_tokens
        cut = chat.choices[0].finish_reason == "length"
        assert response.status == ("incomplete" if cut else "completed")
        assert (response.incomplete_details is not None) == cut
        streamed = list(client.responses.create(
            model="tiny", instructions="Be brief.", input=ASK, temperature=0,
            max_output_tokens=max_tokens, stream=True))
        text = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
        assert text == response.output_text
        assert streamed[-1].type == "response.completed"
        assert streamed[-1].response.status == response.status
        assert streamed[-1].response.output_text == text
    with client.responses.stream(model="tiny", input=ASK, max_output_tokens=3) as stream:
        assert stream.get_final_response().status == "incomplete"


def test_logprobs_of_the_text(tiny_server):
    response = tiny_server.client.responses.create(
        model="tiny", input=ASK, max_output_tokens=4, temperature=0, top_logprobs=2,
        include=["message.output_text.logprobs"])
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert "".join(lp.token for lp in logprobs) == response.output_text
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.logprob
               for lp in logprobs)
    asked = tiny_server.client.responses.create(  # include alone asks for them, as OpenAI's
        model="tiny", input=ASK, max_output_tokens=4, temperature=0,
        include=["message.output_text.logprobs"])
    assert [lp.logprob for lp in asked.output[0].content[0].logprobs] == pytest.approx(
        [lp.logprob for lp in logprobs])
    assert all(lp.top_logprobs == [] for lp in asked.output[0].content[0].logprobs)
    plain = tiny_server.client.responses.create(model="tiny", input=ASK, max_output_tokens=4,
                                                temperature=0)
    assert not plain.output[0].content[0].logprobs


class Alarm(BaseModel):
    on: bool
    mode: Literal["once", "daily"]


def test_text_format_holds_the_reply_to_the_schema(tiny_server):
    for seed in (1, 2):
        response = tiny_server.client.responses.parse(
            model="tiny", input="Set an alarm.", text_format=Alarm, max_output_tokens=60,
            temperature=1.0, extra_body={"seed": seed})
        assert isinstance(response.output_parsed, Alarm)
        assert response.text.format.type == "json_schema"


LIGHTS = {"type": "function", "name": "lights", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
    "additionalProperties": False}}


def test_a_named_tool_choice_forces_the_call(tiny_server):
    response = tiny_server.client.responses.create(
        model="tiny", input="Lights off.", tools=[WEATHER, LIGHTS], max_output_tokens=40,
        temperature=0, tool_choice={"type": "function", "name": "lights"})
    [call] = response.output
    assert call.type == "function_call" and call.name == "lights"
    assert isinstance(json.loads(call.arguments)["on"], bool)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x " * 200}, "input"),
    ({"input": "Hi", "max_output_tokens": 500}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
    ({"input": "Hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "f"}},
     "tool_choice.name"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "s",
                                         "schema": {"type": "object", "minProperties": "x"}}}},
     "text.format"),
])
def test_bad_requests_are_400_naming_the_field(tiny_server, body, param):
    reply = httpx.post(f"{tiny_server.url}/v1/responses", json={"model": "tiny", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert "messages" not in error["message"] and "max_tokens" not in error["message"]
    # The server goes on answering.
    assert tiny_server.client.responses.create(model="tiny", input="Hi",
                                               max_output_tokens=2).status == "incomplete"


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"conversation": "conv_1"}, "conversation", "send the conversation in input"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice",
     "or {'type': 'function', 'name': ...}, got 'any'"),
])
def test_errors_word_what_a_responses_request_sends(tiny_server, body, param, says):
    reply = httpx.post(f"{tiny_server.url}/v1/responses",
                       json={"model": "tiny", "input": "Hi", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_usage_counts_the_prompt_tokens_found_cached(tiny_server):
    """OpenAI's prompt_tokens_details.cached_tokens (input_tokens_details in a response): the
    leading full blocks of the prompt the prefix cache held (at first, only the chat
    template's system turn, which every request shares)."""
    client = tiny_server.client
    ask = [{"role": "user", "content": "cached " * 50}]
    first = client.chat.completions.create(model="tiny", messages=ask, max_tokens=2)
    again = client.chat.completions.create(model="tiny", messages=ask, max_tokens=2)
    block = tiny_server.state.config.block_size
    before = first.usage.prompt_tokens_details.cached_tokens
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert before % block == 0 and cached % block == 0
    assert before < 50 < cached < again.usage.prompt_tokens
    response = client.responses.create(model="tiny", input=ask, max_output_tokens=2)
    assert response.usage.input_tokens_details.cached_tokens == cached
    streamed = list(client.chat.completions.create(
        model="tiny", messages=ask, max_tokens=2, stream=True,
        stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_a_client_that_goes_away_mid_stream_aborts_its_request(tiny_server):
    """Closing a streamed response aborts the engine request and frees its blocks; the
    server's count of requests in flight returns to zero."""
    state = tiny_server.state
    body = {"model": "tiny", "input": "Tell a long story.", "max_output_tokens": 90,
            "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{tiny_server.url}/v1/responses",
                                                       json=body) as response:
        lines = response.iter_lines()
        received = [line for _, line in zip(range(24), lines, strict=False)
                    if line.startswith("event: ")]
        assert "event: response.output_text.delta" in received
        assert state.engine.engine.num_running == 1
    deadline = time.monotonic() + 30
    while (state.in_flight or state.engine.engine.num_running) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (state.in_flight, state.engine.engine.num_running) == (0, 0)
    state.engine.engine.kv.allocator.check_all_free()
