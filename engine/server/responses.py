"""POST /v1/responses (OpenAI's Responses API): the request runs as a chat completion
(responses_protocol.py translates it), and its reply is answered as a response object, whole
or as the Responses API's stream of typed events (responses_stream.py).

Errors name the Responses request's own fields (`input`, `max_output_tokens`, `text.format`,
`tools[0].name`), never the chat fields it was translated into.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.core.errors import EngineDeadError, RequestError
from tokenmill.engine.server.errors import APIError, client_closed
from tokenmill.engine.server.openai_serving import chat_call, chat_chunks, collect, start
from tokenmill.engine.server.rendering import Call, full_response
from tokenmill.engine.server.responses_items import finished_response
from tokenmill.engine.server.responses_protocol import RequestFormatError, ResponsesRequest
from tokenmill.engine.server.responses_stream import ResponseEvents
from tokenmill.engine.server.state import ServerState

# Chat request fields -> the Responses field the user set, for error messages and params.
_USER_TERMS = [
    (re.compile(r"\bmax_completion_tokens\b|\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"\bmessages\b"), "input"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\b(tools\[\d+\])\.function\."), r"\1."),
    (re.compile(r"\btool_choice\.function\."), "tool_choice."),
    (re.compile(r"\{'type': 'function', 'function': \{'name': \.\.\.\}\}"),
     "{'type': 'function', 'name': ...}"),
]


async def create_response(body: ResponsesRequest, request: Request,
                          state: ServerState) -> Any:
    try:
        chat = body.to_chat()
        call = await chat_call(chat, state, id_prefix="resp_")
        streams = await start(call, body.stream, state)
    except RequestFormatError as exc:
        raise _in_user_terms(APIError(400, str(exc), param=exc.param)) from exc
    except APIError as exc:
        raise _in_user_terms(exc) from exc
    shell = response_shell(body, call)

    def count_tokens(text: str) -> int:
        return len(state.tokenizer.encode(text, add_special_tokens=False))

    if body.stream:
        bodies = chat_chunks(call, streams, include_usage=True, state=state)
        return StreamingResponse(_events(ResponseEvents(shell, count_tokens), bodies),
                                 media_type="text/event-stream")
    finals = await collect(streams, request, state)
    if finals is None:
        return client_closed()
    return JSONResponse(finished_response(shell, full_response(call, finals, state),
                                          count_tokens))


def response_shell(body: ResponsesRequest, call: Call) -> dict[str, Any]:
    """The response object before any output: the request's settings as they were applied."""
    return {
        "id": call.id, "object": "response", "created_at": call.created,
        "status": "in_progress", "error": None, "incomplete_details": None,
        "model": call.model, "instructions": body.instructions, "output": [],
        "max_output_tokens": body.max_output_tokens,
        "temperature": call.params.temperature, "top_p": call.params.top_p,
        "tools": body.tools or [], "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls, "text": body.text_format(),
        "reasoning": body.reasoning or {"effort": None, "summary": None},
        "previous_response_id": None, "store": False, "background": False,
        "truncation": "disabled", "metadata": body.metadata or {}, "user": body.user,
        "usage": None,
    }


async def _events(events: ResponseEvents, bodies: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """The stream: created and in_progress, the output's events as the reply comes, then
    completed (or incomplete); an error mid-way ends it with an error event."""
    try:
        for event in events.opening():
            yield event
        async with contextlib.aclosing(bodies):
            async for body in bodies:
                for event in events.chat_chunk(body):
                    yield event
        for event in events.closing():
            yield event
    except (APIError, RequestError, EngineDeadError) as exc:
        yield events.error(str(exc))


def _in_user_terms(err: APIError) -> APIError:
    message, param = err.message, err.param
    for pattern, term in _USER_TERMS:
        message = pattern.sub(term, message)
        param = pattern.sub(term, param) if param else param
    return APIError(err.status, message, param=param, code=err.code, headers=err.headers)
