"""POST /v1/responses (OpenAI's Responses API): the request runs as a chat completion
(responses_protocol.py translates it), and its reply is answered as a response object, whole
or as the Responses API's stream of typed events (responses_stream.py). Unless the request says
`store: false`, the finished response is kept (responses_store.py) for GET, for a follow-up's
`previous_response_id`, and, with `background: true`, while it runs after the POST has
answered.

Errors name the Responses request's own fields (`input`, `max_output_tokens`, `text.format`,
`tools[0].name`), never the chat fields it was translated into.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.core.errors import EngineDeadError, RequestError
from tokenmill.engine.server.errors import APIError, client_closed, reworded
from tokenmill.engine.server.openai_serving import chat_call, chat_chunks, collect, start
from tokenmill.engine.server.rendering import Call, full_response
from tokenmill.engine.server.responses_items import finished_response
from tokenmill.engine.server.responses_protocol import RequestFormatError, ResponsesRequest
from tokenmill.engine.server.responses_store import ResponseStore, StoredResponse
from tokenmill.engine.server.responses_stream import ResponseEvents
from tokenmill.engine.server.state import ServerState
from tokenmill.engine.server.translated_stream import translated_events

log = logging.getLogger(__name__)

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
    store = state.responses
    kept = store.enabled and body.store is not False
    _check_storing(body, kept)
    history, call = await _call(body, state)
    try:
        streams = await start(call, body.stream, state)
    except APIError as exc:
        raise reworded(exc, _USER_TERMS) from exc
    shell = response_shell(body, call, kept)
    entry = StoredResponse(shell, body.input_items())

    def count_tokens(text: str) -> int:
        return len(state.tokenizer.encode(text, add_special_tokens=False))

    def finished(response: dict[str, Any]) -> dict[str, Any]:
        if kept:
            entry.response = response
            entry.conversation = [*history, *entry.input_items, *response["output"]]
            store.put(entry)
        return response

    if body.background:
        entry.response = {**shell, "status": "queued"}
        store.put(entry)
        store.run(entry, asyncio.create_task(
            _background(entry, call, streams, state, count_tokens, finished)))
        return JSONResponse(entry.response)
    if body.stream:
        bodies = chat_chunks(call, streams, include_usage=True, state=state)
        events = ResponseEvents(shell, count_tokens)
        return StreamingResponse(
            translated_events(events, bodies, lambda: events.closing(finished)),
            media_type="text/event-stream")
    finals = await collect(streams, request, state)
    if finals is None:
        return client_closed()
    return JSONResponse(finished(finished_response(shell, full_response(call, finals, state),
                                                   count_tokens)))


async def count_input_tokens(body: ResponsesRequest, state: ServerState) -> dict[str, Any]:
    """The prompt's tokens as POST /v1/responses would render it (OpenAI's
    /v1/responses/input_tokens, the openai client's `responses.input_tokens.count`)."""
    _, call = await _call(body, state)
    return {"object": "response.input_tokens", "input_tokens": len(call.prompts_ids[0])}


async def _call(body: ResponsesRequest, state: ServerState) -> tuple[list[dict], Call]:
    """The conversation the request continues, and the request as a checked chat call (its
    prompt rendered), not started."""
    store = state.responses
    history = (store.get(body.previous_response_id, "previous_response_id").conversation
               if body.previous_response_id is not None else [])
    if history is None:
        raise APIError(400, f"response {body.previous_response_id!r} has not finished; "
                            "continue it once it has", param="previous_response_id")
    if isinstance(body.input, list):
        body.input = _referenced(body.input, store)
    try:
        return history, await chat_call(body.to_chat(history), state, id_prefix="resp_")
    except RequestFormatError as exc:
        raise reworded(APIError(400, str(exc), param=exc.param), _USER_TERMS) from exc
    except APIError as exc:
        raise reworded(exc, _USER_TERMS) from exc


def _referenced(items: list[dict[str, Any]], store: ResponseStore) -> list[dict[str, Any]]:
    """The items, each item_reference replaced by the stored item it names."""
    resolved = []
    for i, item in enumerate(items):
        if item.get("type") == "item_reference":
            found = store.find_item(item.get("id"))
            if found is None:
                raise APIError(400, f"input[{i}]: no stored item {item.get('id')!r} (items "
                                    "are found in the responses this server keeps)",
                               param=f"input[{i}].id")
            item = found
        resolved.append(item)
    return resolved


def _check_storing(body: ResponsesRequest, kept: bool) -> None:
    if body.background and not kept:
        raise APIError(400, "a background response must be stored: set store true (the "
                            "default) on a server that stores responses "
                            "(--max-stored-responses above 0)", param="background")
    if body.background and body.stream:
        raise APIError(400, "a background response is not streamed: poll GET "
                            "/v1/responses/{id} until its status is final", param="stream")


async def _background(entry: StoredResponse, call: Call, streams: list, state: ServerState,
                      count_tokens: Callable[[str], int],
                      finished: Callable[[dict[str, Any]], Any]) -> None:
    """A background response's run: in progress until its reply is collected, then finished
    (stored with its output); failed with the error, or cancelled (the requests aborted)."""
    entry.response = {**entry.response, "status": "in_progress"}
    try:
        finals = await collect(streams, None, state)
    except asyncio.CancelledError:
        entry.response = {**entry.response, "status": "cancelled"}
        raise
    except Exception as exc:  # no client waits: the response says what failed
        if not isinstance(exc, (APIError, RequestError, EngineDeadError)):
            log.exception("background response failed", extra={"id": call.id})
        entry.response = {**entry.response, "status": "failed",
                          "error": {"code": "server_error", "message": str(exc)}}
        return
    finished(finished_response(entry.response, full_response(call, finals, state),
                               count_tokens))


def response_shell(body: ResponsesRequest, call: Call, stored: bool) -> dict[str, Any]:
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
        "previous_response_id": body.previous_response_id, "store": stored,
        "background": bool(body.background),
        "truncation": "disabled", "metadata": body.metadata or {}, "user": body.user,
        "usage": None,
    }


def retrieve_response(response_id: str, state: ServerState, stream: bool = False
                      ) -> dict[str, Any]:
    if stream:  # OpenAI's resumption of a background response's events
        raise APIError(400, "a stored response is not streamed again: GET it without stream "
                            "(a background response's status shows how far it is)",
                       param="stream")
    return state.responses.get(response_id).response


def delete_response(response_id: str, state: ServerState) -> dict[str, Any]:
    """Forget a stored response (a background one still running is cancelled)."""
    entry = state.responses.delete(response_id)
    if entry.task is not None:
        entry.task.cancel()
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def cancel_response(response_id: str, state: ServerState) -> dict[str, Any]:
    """Stop a background response (its requests aborted); one that has already ended is
    answered as it is."""
    entry = state.responses.get(response_id)
    if entry.task is None:
        raise APIError(400, f"response {response_id!r} was not created in the background; "
                            "only background responses can be cancelled",
                       param="response_id")
    if not entry.task.done():
        entry.task.cancel()
        await asyncio.wait({entry.task})
    return entry.response


def list_input_items(response_id: str, state: ServerState, order: str, limit: int,
                     after: str | None) -> dict[str, Any]:
    """A stored response's input items, a page at a time (OpenAI's list shape)."""
    items = state.responses.get(response_id).input_items
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise APIError(400, f"no input item {after!r} in response {response_id!r}",
                           param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit}
