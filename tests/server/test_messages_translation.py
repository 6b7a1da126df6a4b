"""The Messages API's request as a chat request, without a server: content blocks, system
blocks, images, thinking and the tool settings in the chat shape."""

from __future__ import annotations

import pytest

from tokenmill.engine.server.messages_items import stop_reason, tool_input
from tokenmill.engine.server.messages_protocol import MessagesRequest, chat_messages
from tokenmill.engine.server.responses_protocol import RequestFormatError


def test_blocks_become_the_chat_conversation():
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "What is here?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBOR"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look first.", "signature": "s"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "zoom", "input": {"x": 2}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1",
             "content": [{"type": "text", "text": "a cat"}, {"type": "text", "text": "grey"}]},
            {"type": "text", "text": "So?"}]},
    ]
    assert chat_messages("Be terse.", messages) == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is here?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
        {"role": "assistant", "content": "Let me look.", "reasoning": "Look first.",
         "tool_calls": [{"id": "t1", "type": "function",
                         "function": {"name": "zoom", "arguments": '{"x": 2}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a cat\ngrey", "name": "zoom"},
        {"role": "user", "content": "So?"},
    ]


def test_the_settings_in_chat_terms():
    body = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "Hi"}],
        "system": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        "stop_sequences": ["END"], "top_k": 3, "metadata": {"user_id": "u1"},
        "thinking": {"type": "disabled"},
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    chat = body.to_chat()
    assert (chat.messages[0].role, chat.messages[0].content) == ("system", "One.\nTwo.")
    assert (chat.max_completion_tokens, chat.stop, chat.top_k, chat.user) == (
        7, ["END"], 3, "u1")
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    assert chat.tools == [{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object"}}}]
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", False)
    assert body.to_chat(max_tokens=1).max_completion_tokens == 1


def test_a_last_assistant_message_is_continued():
    """Anthropic's prefill: the reply continues the assistant's last message, unless the
    request says otherwise in vLLM's own fields."""
    said = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "{"}]
    body = {"model": "m", "max_tokens": 5, "messages": said}
    chat = MessagesRequest.model_validate(body).to_chat()
    assert (chat.add_generation_prompt, chat.continue_final_message) == (False, True)
    plain = MessagesRequest.model_validate({**body, "messages": said[:1]}).to_chat()
    assert (plain.add_generation_prompt, plain.continue_final_message) == (True, False)
    chosen = MessagesRequest.model_validate({**body, "add_generation_prompt": True}).to_chat()
    assert (chosen.add_generation_prompt, chosen.continue_final_message) == (True, False)


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "file", "file_id": "f"}}]}]}, "messages[0].content[0].source.type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result",
                                                      "tool_use_id": "t"}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
     "messages[0].content[0].type"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
])
def test_what_cannot_be_served_names_its_field(fields, param):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}],
            **fields}
    with pytest.raises(RequestFormatError) as err:
        MessagesRequest.model_validate(body).to_chat()
    assert err.value.param == param


@pytest.mark.parametrize(("finish", "stopped_by", "expected"), [
    ("length", None, ("max_tokens", None)),
    ("tool_calls", None, ("tool_use", None)),
    ("stop", "END", ("stop_sequence", "END")),
    ("stop", None, ("end_turn", None)),
    ("stop", 7, ("end_turn", None)),  # a stop token id is not one of the stop_sequences
    (None, None, (None, None)),
])
def test_stop_reasons(finish, stopped_by, expected):
    assert stop_reason(finish, stopped_by, ["END"]) == expected


def test_tool_input_keeps_arguments_that_are_not_an_object():
    assert tool_input('{"a": 1}') == {"a": 1}
    assert tool_input("[1, 2]") == {"arguments": "[1, 2]"}
    assert tool_input("{broken") == {"arguments": "{broken"}
