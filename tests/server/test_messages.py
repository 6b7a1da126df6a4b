"""POST /v1/messages (Anthropic's Messages API) over real HTTP with the official anthropic
client: the same reply and usage as the equivalent chat completion, whole and as the API's
events (the client's own stream helper assembles them), the thinking, text and tool calls as
content blocks, tool results sent back as the chat conversation's tool messages, stop
sequences, token counting, the client's x-api-key header, and errors in Anthropic's shape
naming the Messages field. The agent model is scripted (tool_support.py): greedy decoding
thinks, says a sentence and calls two tools."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_support import in_process_server
from tool_support import HERMES_REPLY, HERMES_SPECIAL, HERMES_TEMPLATE, make_scripted_model

THINKING = ["<thi", "nk>Two look", "ups.</thi", "nk>\n\n"]
WEATHER = {"name": "get_weather", "description": "Current weather.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                             "days": {"type": "integer"}},
                            "required": ["city"]}}
TIME = {"name": "get_time",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
ASK = "Weather in Paris, and the time in CET?"
GREEDY = {"temperature": 0}  # extra_body: the anthropic client takes no temperature itself


def chat_tool(tool: dict) -> dict:
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


@pytest.fixture(scope="module")
def agent(tmp_path_factory, smol_tokenizer):
    directory = make_scripted_model(str(tmp_path_factory.mktemp("agent")), smol_tokenizer,
                                    HERMES_TEMPLATE, THINKING + HERMES_REPLY, HERMES_SPECIAL)
    options = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes",
               "reasoning_parser": "qwen3", "api_key": "sk-test"}
    with in_process_server(directory, "agent", options=options, max_num_seqs=4) as server:
        yield server


@pytest.fixture(scope="module")
def client(agent):
    """Anthropic's client. Its package is imported here, not at the top: it is the slowest
    import of all the tests, and every pytest-xdist worker imports every test file."""
    import anthropic

    return anthropic.Anthropic(base_url=agent.url, api_key="sk-test", max_retries=0)


def chat_client(agent) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{agent.url}/v1", api_key="sk-test", max_retries=0)


def shape(content) -> list[tuple]:
    blocks = []
    for block in content:
        if block.type == "thinking":
            blocks.append(("thinking", block.thinking))
        elif block.type == "text":
            blocks.append(("text", block.text))
        else:
            blocks.append(("tool_use", block.name, block.input))
    return blocks


EXPECTED = [("thinking", "Two lookups."),
            ("text", "Let me check.\n"),
            ("tool_use", "get_weather", {"city": "Paris", "days": 3}),
            ("tool_use", "get_time", {"zone": "CET"})]


def test_thinking_text_and_tool_calls_are_content_blocks(agent, client):
    message = client.messages.create(model="agent", max_tokens=200, tools=[WEATHER, TIME],
                                     messages=[{"role": "user", "content": ASK}],
                                     extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == "agent"
    assert shape(message.content) == EXPECTED
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len({call.id for call in calls}) == 2
    chat = chat_client(agent).chat.completions.create(
        model="agent", messages=[{"role": "user", "content": ASK}],
        tools=[chat_tool(WEATHER), chat_tool(TIME)], temperature=0)
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens


def test_the_stream_builds_the_same_message(client):
    request = {"model": "agent", "max_tokens": 200, "tools": [WEATHER, TIME],
               "messages": [{"role": "user", "content": ASK}], "extra_body": GREEDY}
    whole = client.messages.create(**request)
    events = list(client.messages.create(stream=True, **request))
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [event for event in events if event.type == "content_block_start"]
    assert [event.index for event in starts] == [0, 1, 2, 3]
    assert kinds.count("content_block_stop") == 4
    assert events[-2].delta.stop_reason == "tool_use"
    # Every tool_use block's input_json deltas join to its input.
    for start, expected in zip(starts[2:], EXPECTED[2:], strict=True):
        joined = "".join(event.delta.partial_json for event in events
                         if event.type == "content_block_delta"
                         and event.index == start.index)
        assert json.loads(joined) == expected[2]
    with client.messages.stream(**request) as stream:
        assembled = stream.get_final_message()
    assert shape(assembled.content) == shape(whole.content) == EXPECTED
    assert assembled.stop_reason == "tool_use"
    assert assembled.usage.output_tokens == whole.usage.output_tokens


def test_tool_results_sent_back_are_the_chat_conversation(agent, client):
    """An assistant's tool_use blocks and the user's tool_result blocks reach the template as
    the chat conversation's tool call and tool message do."""
    arguments = {"city": "Paris"}
    counted = client.messages.count_tokens(model="agent", tools=[WEATHER], messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": arguments}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny, 21 C"},
            {"type": "text", "text": "And tomorrow?"}]}])
    chat = chat_client(agent).chat.completions.create(model="agent", max_tokens=1, tools=[
        chat_tool(WEATHER)], messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "user", "content": "And tomorrow?"}])
    assert counted.input_tokens == chat.usage.prompt_tokens
    alone = client.messages.count_tokens(model="agent", messages=[
        {"role": "user", "content": ASK}])
    assert counted.input_tokens > alone.input_tokens + 10


def test_a_named_tool_is_forced(client):
    # The scripted model knows no arguments: under the tool's grammar it writes whatever its
    # random head prefers, so a free string could run past max_tokens. An enum bounds it.
    zoned = {"name": "get_time", "input_schema": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["CET", "UTC"]}},
        "required": ["zone"]}}
    message = client.messages.create(model="agent", max_tokens=60, tools=[WEATHER, zoned],
                                     tool_choice={"type": "tool", "name": "get_time"},
                                     messages=[{"role": "user", "content": ASK}],
                                     extra_body=GREEDY)
    [call] = message.content
    assert (call.type, call.name, message.stop_reason) == ("tool_use", "get_time", "tool_use")
    assert call.input["zone"] in {"CET", "UTC"} and set(call.input) == {"zone"}


def test_stop_sequences_end_the_text(client):
    """The stop sequence that ended the reply is its stop_sequence, and the text stops
    before it, whole and streamed."""
    ask = [{"role": "user", "content": "Hello"}]
    full = client.messages.create(model="agent", max_tokens=200, messages=ask,
                                  extra_body=GREEDY)
    text = shape(full.content)[1][1]
    assert text.startswith("Let me check.")
    cut = client.messages.create(model="agent", max_tokens=200, messages=ask,
                                 stop_sequences=["nowhere", "check"], extra_body=GREEDY)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "check")
    assert shape(cut.content)[-1] == ("text", "Let me ")
    with client.messages.stream(model="agent", max_tokens=200, messages=ask,
                                stop_sequences=["check"], extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "check")
    short = client.messages.create(model="agent", max_tokens=2, messages=ask)
    assert (short.stop_reason, short.usage.output_tokens) == ("max_tokens", 2)


def test_a_prefilled_reply_is_continued(agent, client):
    """Anthropic's prefill: a last assistant message is continued, and the reply holds only
    what follows it, as the chat completion's continue_final_message gives it."""
    said = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Let me"}]
    message = client.messages.create(model="agent", max_tokens=4, messages=said,
                                     extra_body=GREEDY)
    chat = chat_client(agent).chat.completions.create(
        model="agent", max_tokens=4, temperature=0, messages=said,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert shape(message.content) == [("text", chat.choices[0].message.content)]
    assert message.usage.output_tokens == chat.usage.completion_tokens


def test_the_api_key_comes_in_x_api_key(agent):
    import anthropic

    wrong = anthropic.Anthropic(base_url=agent.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="agent", max_tokens=2,
                              messages=[{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize(("body", "status", "kind", "says"), [
    ({"messages": [{"role": "user", "content": "Hi"}]}, 400, "invalid_request_error",
     "max_tokens"),
    ({"max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"max_tokens": 5, "stop_sequences": ["x"] * 17}, 400, "invalid_request_error",
     "stop_sequences: at most 16"),
    ({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     400, "invalid_request_error", "tools[0].type"),
    ({"max_tokens": 5, "tools": [WEATHER], "tool_choice": {"type": "some"}}, 400,
     "invalid_request_error", "tool_choice.type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}, 400, "invalid_request_error",
     "messages[0].content[0].type"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "Hi"}]}, 400,
     "invalid_request_error", "messages[0].role"),
    ({"max_tokens": 5, "model": "nope"}, 404, "not_found_error", "nope"),
])
def test_errors_take_anthropics_shape_and_name_the_field(agent, client, body, status, kind,
                                                        says):
    sent = {"model": "agent", "messages": [{"role": "user", "content": "Hi"}], **body}
    reply = httpx.post(f"{agent.url}/v1/messages", json=sent, headers={"x-api-key": "sk-test"})
    assert reply.status_code == status, reply.text
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert says in error["error"]["message"], error
    # The server goes on answering.
    assert client.messages.create(model="agent", max_tokens=2,
                                  messages=[{"role": "user", "content": "Hi"}]).content
