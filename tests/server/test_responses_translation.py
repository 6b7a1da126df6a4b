"""The Responses API's translation, without a server: input items into chat messages, the
request into a chat request, and streamed chat chunks into the Responses API's events."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine.server.responses_protocol import (
    RequestFormatError,
    ResponsesRequest,
    input_messages,
)
from tokenmill.engine.server.responses_stream import ResponseEvents

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
           "strict": True}


def test_input_items_become_the_chat_conversation():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Weather in "},
                     {"type": "input_text", "text": "Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Look it up."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather",
         "arguments": "{\"city\": \"Lyon\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "rain"}]},
    ]
    assert input_messages(items, instructions="You are terse.") == [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in \nParis?"},  # parts one a line, as in chat
        {"role": "assistant", "content": "Checking.", "reasoning": "Look it up.",
         "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
             {"id": "c2", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain", "name": "get_weather"},
    ]
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]


def test_input_images_become_image_url_parts():
    items = [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]}]
    assert input_messages(items) == [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]


def test_a_call_with_no_text_before_it_opens_its_own_assistant_turn():
    items = [{"role": "user", "content": "Hi"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
    assert input_messages(items)[1] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}]}


@pytest.mark.parametrize(("items", "param"), [
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
     "input[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}],
     "input[0].content[0].image_url"),
    ([{"role": "robot", "content": "Hi"}], "input[0].role"),
    ([{"role": "user", "content": 5}], "input[0].content"),
    ([{"role": "user", "content": "Hi"}, {"type": "function_call", "name": "f",
                                           "arguments": "{}"}], "input[1].call_id"),
    ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
    ([{"type": "web_search_call", "id": "ws_1"}], "input[0].type"),
    ([{"role": "system", "content": "Only instructions."}], "input"),
])
def test_bad_input_items_name_the_item(items, param):
    with pytest.raises(RequestFormatError) as err:
        input_messages(items)
    assert err.value.param == param
    assert str(err.value).startswith(param + ": ")


def test_the_request_as_a_chat_request():
    body = ResponsesRequest.model_validate({
        "model": "m", "input": "Hi", "instructions": "Be terse.", "max_output_tokens": 9,
        "temperature": 0.5, "top_k": 4, "seed": 3, "stop": ["\n"], "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False, "top_logprobs": 2,
        "text": {"format": {"type": "json_schema", "name": "w", "strict": True,
                            "schema": {"type": "object"}}},
        "chat_template_kwargs": {"enable_thinking": False}})
    chat = body.to_chat()
    assert [m.role for m in chat.messages] == ["system", "user"]
    assert (chat.max_completion_tokens, chat.temperature, chat.top_k, chat.seed, chat.stop) == (
        9, 0.5, 4, 3, ["\n"])
    assert chat.tools == [{"type": "function", "function": {
        k: v for k, v in WEATHER.items() if k != "type"}}]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.parallel_tool_calls is False
    assert (chat.logprobs, chat.top_logprobs) == (True, 2)
    assert chat.response_format.json_schema.schema_ == {"type": "object"}
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    assert body.text_format() == {"format": {"type": "json_schema", "name": "w", "strict": True,
                                             "schema": {"type": "object"}}}


@pytest.mark.parametrize(("fields", "param"), [
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"truncation": "auto"}, "truncation"),
    ({"n": 2}, "n"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
])
def test_what_cannot_be_served_names_its_field(fields, param):
    with pytest.raises(RequestFormatError) as err:
        ResponsesRequest.model_validate({"input": "Hi", **fields}).to_chat()
    assert err.value.param == param


# ---- streamed events ----------------------------------------------------------------------

def chunk(delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                         "logprobs": None if logprobs is None else {"content": logprobs}}]}


def parse(stream: list[bytes]) -> list[dict]:
    """Each event's body, checking its `event:` line names its type."""
    events = []
    for event in stream:
        for block in event.decode().strip().split("\n\n"):
            kind, data = block.split("\n")
            body = json.loads(data.removeprefix("data: "))
            assert kind == f"event: {body['type']}"
            events.append(body)
    return events


def run(chunks: list[dict], usage: dict | None = None) -> list[dict]:
    events = ResponseEvents({"id": "resp_1", "output": [], "status": "in_progress"},
                            count_tokens=lambda text: len(text.split()))
    stream = list(events.opening())
    for body in chunks:
        stream += events.chat_chunk(body)
    if usage is not None:
        stream += events.chat_chunk({"choices": [], "usage": usage})
    stream += events.closing()
    return parse(stream)


USAGE = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
         "prompt_tokens_details": {"cached_tokens": 4}}


def test_thinking_text_and_calls_stream_as_items_in_order():
    token = {"token": "It", "logprob": -0.5, "bytes": [73, 116], "top_logprobs": []}
    events = run([
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "Look it", "reasoning_content": "Look it"}),
        chunk({"reasoning": " up.", "reasoning_content": " up."}),
        chunk({"content": "It"}, logprobs=[token]),
        chunk({"content": " is."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "f", "arguments": "{\"x\""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "g", "arguments": "{}"}}]},
              finish="tool_calls"),
    ], USAGE)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    final = events[-1]["response"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert final["output"] == done
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [
        0, 1, 2, 3]
    thinking, message, first, second = done
    assert thinking["content"] == [{"type": "reasoning_text", "text": "Look it up."}]
    assert message["content"][0]["text"] == "It is." and message["status"] == "completed"
    assert message["content"][0]["logprobs"] == [token]
    assert (first["call_id"], first["name"], first["arguments"]) == ("call_a", "f", "{\"x\": 1}")
    assert (second["call_id"], second["name"], second["arguments"]) == ("call_b", "g", "{}")
    assert final["status"] == "completed" and final["incomplete_details"] is None
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (5, 9)
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4}


def test_a_reply_cut_short_ends_incomplete():
    events = run([chunk({"content": "Once upon"}, finish="length")], USAGE)
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"


def test_a_call_cut_short_is_the_incomplete_item_and_what_came_before_is_complete():
    """Streamed and whole alike: the last item is the one max_output_tokens cut."""
    from tokenmill.engine.server.responses_items import finished_response

    events = run([chunk({"content": "Let me look."}),
                  chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "f", "arguments": "{\"ci"}}]},
                        finish="length")], USAGE)
    streamed = events[-1]["response"]["output"]
    whole = finished_response(
        {"id": "resp_1"},
        {"choices": [{"finish_reason": "length", "message": {
            "content": "Let me look.", "tool_calls": [{"id": "call_a", "function": {
                "name": "f", "arguments": "{\"ci"}}]}}], "usage": USAGE},
        count_tokens=lambda text: len(text.split()))["output"]
    for output in (streamed, whole):
        assert [(item["type"], item["status"]) for item in output] == [
            ("message", "completed"), ("function_call", "incomplete")]


def test_an_empty_reply_is_one_empty_message():
    events = run([chunk({"role": "assistant", "content": ""}), chunk({}, finish="stop")], USAGE)
    [item] = events[-1]["response"]["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == ""


def test_an_error_ends_the_stream_failed():
    events = ResponseEvents({"id": "resp_1", "status": "in_progress"}, lambda text: 0)
    opened = list(events.opening())
    error = parse([events.error("engine stopped")])
    assert [e["type"] for e in error] == ["error", "response.failed"]
    assert error[0]["message"] == "engine stopped"
    assert error[1]["response"]["status"] == "failed"
    assert error[1]["sequence_number"] == len(opened) + 1
