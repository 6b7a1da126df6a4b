"""POST /v1/messages (Anthropic's Messages API, as the anthropic client and Claude Code call
it) and POST /v1/messages/count_tokens: the request runs as a chat completion
(messages_protocol.py translates it), and its reply is answered as a message, whole or as the
API's stream of events (messages_stream.py).

Errors name the Messages request's own fields (`max_tokens`, `stop_sequences`,
`tools[0].input_schema`), in Anthropic's error shape (errors.py).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.server.errors import APIError, client_closed, reworded
from tokenmill.engine.server.messages_items import finished_message, message_shell
from tokenmill.engine.server.messages_protocol import MessagesRequest
from tokenmill.engine.server.messages_stream import MessageEvents
from tokenmill.engine.server.openai_serving import chat_call, chat_chunks, collect, start
from tokenmill.engine.server.rendering import Call, full_response
from tokenmill.engine.server.responses_protocol import RequestFormatError
from tokenmill.engine.server.state import ServerState
from tokenmill.engine.server.translated_stream import translated_events

# Chat request fields -> the Messages field the user set, for error messages and params.
_USER_TERMS = [
    (re.compile(r"\bmax_completion_tokens\b"), "max_tokens"),
    (re.compile(r"^stop\b"), "stop_sequences"),
    (re.compile(r"\b(tools\[\d+\])\.function\.parameters\b"), r"\1.input_schema"),
    (re.compile(r"\b(tools\[\d+\])\.function\."), r"\1."),
    (re.compile(r"\btool_choice\.function\."), "tool_choice."),
    (re.compile(r"tool_choice: \"auto\""), "tool_choice {\"type\": \"auto\"}"),
    (re.compile(r"tool_choice \"required\""), "tool_choice {\"type\": \"any\"}"),
]


async def create_message(body: MessagesRequest, request: Request, state: ServerState) -> Any:
    if body.max_tokens is None:
        raise APIError(400, "max_tokens: Field required", param="max_tokens")
    call = await _call(body, state, body.max_tokens)
    try:
        streams = await start(call, body.stream, state)
    except APIError as exc:
        raise reworded(exc, _USER_TERMS) from exc
    shell = message_shell(call.id, call.model, len(call.prompts_ids[0]))
    if body.stream:
        bodies = chat_chunks(call, streams, include_usage=True, state=state)
        events = MessageEvents(shell, body.stop_sequences)
        return StreamingResponse(translated_events(events, bodies, events.closing),
                                 media_type="text/event-stream")
    finals = await collect(streams, request, state)
    if finals is None:
        return client_closed()
    return JSONResponse(finished_message(shell, full_response(call, finals, state),
                                         body.stop_sequences))


async def count_message_tokens(body: MessagesRequest, state: ServerState) -> dict[str, int]:
    """The prompt's tokens as /v1/messages would render it (its max_tokens not needed)."""
    call = await _call(body, state, 1)
    return {"input_tokens": len(call.prompts_ids[0])}


async def _call(body: MessagesRequest, state: ServerState, max_tokens: int) -> Call:
    """The request as a checked chat call (its prompt rendered), not started."""
    try:
        return await chat_call(body.to_chat(max_tokens), state, id_prefix="msg_")
    except RequestFormatError as exc:
        raise reworded(APIError(400, str(exc), param=exc.param), _USER_TERMS) from exc
    except APIError as exc:
        raise reworded(exc, _USER_TERMS) from exc
