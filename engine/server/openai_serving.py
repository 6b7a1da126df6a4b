"""/v1/completions and /v1/chat/completions: requests to engine calls, outputs to OpenAI JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.core import CompletionOutput, RequestOutput, SamplingParams
from tokenmill.engine.core.errors import EngineDeadError, RequestError, SamplingParamsError
from tokenmill.engine.frontend.async_engine import RequestStream
from tokenmill.engine.server.errors import APIError, error_body
from tokenmill.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.engine.server.state import ServerState
from tokenmill.engine.server.tools import (
    ReplyToolCalls,
    ToolPlan,
    ToolRequestError,
    plan_tools,
    sampling_for_tools,
)

log = logging.getLogger(__name__)


@dataclass
class _Call:
    """One API call: its engine requests (one per prompt) and what has been sent so far."""

    kind: str  # "completion" or "chat"
    id: str
    model: str
    n: int
    prompts_text: list[str | None]
    prompts_ids: list[list[int]]
    params: SamplingParams
    cache_salt: str | None = None
    echo: bool = False
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: per choice, top-k
    tools: ReplyToolCalls | None = None  # parses chat replies into tool calls
    created: int = field(default_factory=lambda: int(time.time()))
    sent_text: dict[int, int] = field(default_factory=dict)
    sent_tokens: dict[int, int] = field(default_factory=dict)


async def create_completion(body: CompletionRequest, request: Request,
                            state: ServerState) -> Any:
    _check_serving(state, body.model)
    prompts = body.prompts()
    ids = [_tokenize(state, p) for p in prompts]
    max_tokens = body.max_tokens if body.max_tokens is not None else _room(state, ids)
    params = _params(body, max_tokens, body.logprobs)
    await _compile_constraint(state, params, body.constraint_field())
    call = _Call("completion", f"cmpl-{uuid.uuid4().hex}", state.options.served_model_name,
                 body.n, [p if isinstance(p, str) else None for p in prompts], ids, params,
                 cache_salt=body.cache_salt, echo=body.echo,
                 prompt_logprobs=body.prompt_logprobs)
    return await _run(call, body.stream, body.include_usage, request, state)


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 state: ServerState) -> Any:
    _check_serving(state, body.model)
    plan = _tool_plan(body, state)
    try:
        ids = chat_ids(state, body.conversation(), plan.template_tools)
    except ValueError as exc:
        raise APIError(400, f"messages: {exc}", param="messages") from exc
    max_tokens = body.max_completion_tokens or body.max_tokens or _room(state, [ids])
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = _sampling_for_tools(_params(body, max_tokens, logprobs), plan)
    await _compile_constraint(state, params, body.constraint_field() or "tool_choice")
    call = _Call("chat", f"chatcmpl-{uuid.uuid4().hex}", state.options.served_model_name,
                 body.n, [None], [ids], params, cache_salt=body.cache_salt,
                 tools=ReplyToolCalls(plan) if plan.parser is not None else None)
    return await _run(call, body.stream, body.include_usage, request, state)


def _tool_plan(body: ChatCompletionRequest, state: ServerState) -> ToolPlan:
    options = state.options
    try:
        return plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls,
                          options.tool_call_parser if options.enable_auto_tool_choice else None)
    except ToolRequestError as exc:
        raise APIError(400, str(exc), param=exc.param) from exc


def _sampling_for_tools(params: SamplingParams, plan: ToolPlan) -> SamplingParams:
    try:
        return sampling_for_tools(params, plan)
    except ToolRequestError as exc:
        raise APIError(400, str(exc), param=exc.param) from exc


# ---- admission ----------------------------------------------------------------------------

def _check_serving(state: ServerState, model: str | None) -> None:
    check_model(state, model)
    if state.engine.num_waiting >= state.options.max_waiting_requests:
        raise APIError(503, f"too many requests waiting ({state.engine.num_waiting}); "
                            "retry later", headers={"Retry-After": "1"})


def check_model(state: ServerState, model: str | None) -> None:
    """503 unless the model is loaded and serving; 404 for another model's name."""
    if state.draining:
        raise APIError(503, "the server is shutting down", headers={"Retry-After": "1"})
    if state.engine is None:
        message = ("the model failed to load" if state.load_error is not None
                   else "the model is still loading")
        raise APIError(503, message, headers={"Retry-After": "5"})
    if not state.engine.alive:
        raise APIError(503, "the engine stopped; the server must restart")
    if model is not None and model != state.options.served_model_name:
        raise APIError(404, f"the model {model!r} does not exist; this server serves "
                            f"{state.options.served_model_name!r}", param="model",
                       code="model_not_found")


def _tokenize(state: ServerState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return state.tokenizer.encode(prompt)
    return list(prompt)


def chat_ids(state: ServerState, conversation: list[dict[str, Any]],
             tools: list[dict] | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, add_special_tokens: bool = False) -> list[int]:
    """The conversation through the chat template, tokenized (as transformers does with
    tokenize=True: the template writes the special tokens, so none are added by default)."""
    try:
        text = state.tokenizer.apply_chat_template(
            conversation, tools=tools, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=False)
    except Exception as exc:  # template errors (e.g. role order) are the caller's to fix
        raise ValueError(f"the chat template rejected the messages: {exc}") from exc
    return state.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _room(state: ServerState, prompts: list[list[int]]) -> int:
    """Default max_tokens when none is given: what the context leaves after the prompt."""
    longest = max(len(p) for p in prompts)
    if longest >= state.max_model_len:
        raise APIError(400, f"this model's maximum context length is {state.max_model_len} "
                            f"tokens, but the prompt has {longest} tokens", param="messages")
    return state.max_model_len - longest


def _params(body: Any, max_tokens: int, logprobs: int | None) -> SamplingParams:
    try:
        return body.sampling_params(max_tokens, logprobs)
    except SamplingParamsError as exc:
        raise APIError(400, str(exc), param=str(exc).split(":")[0]) from exc


async def _compile_constraint(state: ServerState, params: SamplingParams,
                              field: str | None) -> None:
    """Compile the request's grammar ahead, off both loops; one that does not compile is a
    400 naming the field the user set."""
    try:
        await state.engine.check_constraint(params)
    except RequestError as exc:
        raise APIError(400, f"{field}: {exc}", param=field) from exc


async def _admit(call: _Call, state: ServerState) -> list[RequestStream]:
    streams: list[RequestStream] = []
    try:
        for i, ids in enumerate(call.prompts_ids):
            streams.append(await state.engine.add_request(f"{call.id}-{i}", ids, call.params,
                                                          call.cache_salt))
    except BaseException as exc:
        for stream in streams:
            await stream.aclose()
        if isinstance(exc, RequestError):
            raise APIError(400, str(exc), param=exc.param or (
                "prompt" if call.kind == "completion" else "messages")) from exc
        if isinstance(exc, EngineDeadError):
            raise APIError(503, str(exc)) from exc
        raise
    return streams


# ---- running ------------------------------------------------------------------------------

async def _run(call: _Call, stream: bool, include_usage: bool, request: Request,
               state: ServerState) -> Any:
    state.request_started()
    try:
        streams = await _admit(call, state)
    except BaseException:
        state.request_ended()
        raise
    log.info("request admitted", extra={"id": call.id, "prompts": len(call.prompts_ids),
                                        "n": call.n, "max_tokens": call.params.max_tokens,
                                        "stream": stream})
    if stream:
        return StreamingResponse(_stream(call, streams, include_usage, state),
                                 media_type="text/event-stream")
    try:
        finals = await _collect(streams, request)
    except EngineDeadError as exc:  # the loop died under this request; the server exits
        raise APIError(503, str(exc)) from exc
    finally:
        state.request_ended()
    if finals is None:
        return JSONResponse(error_body(499, "client closed the request"), status_code=499)
    return JSONResponse(_full_response(call, finals, state))


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of every prompt's stream, as they come; closes them all on exit."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for out in s:
                await queue.put((i, out))
        except BaseException as exc:
            await queue.put((i, exc))
            return
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(streams)
    try:
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        for s in streams:
            await s.aclose()


async def _collect(streams: list[RequestStream],
                   request: Request) -> list[RequestOutput] | None:
    """Final outputs in prompt order, or None if the client went away (requests aborted)."""
    finals: dict[int, RequestOutput] = {}

    async def consume() -> None:
        async for i, out in _merged(streams):
            if out.finished:
                finals[i] = out

    task = asyncio.create_task(consume())
    while not task.done():
        await asyncio.wait({task}, timeout=0.5)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
    task.result()
    return [finals[i] for i in range(len(streams))]


async def _stream(call: _Call, streams: list[RequestStream], include_usage: bool,
                  state: ServerState) -> AsyncIterator[str]:
    finals: dict[int, RequestOutput] = {}
    try:
        if call.kind == "chat":
            for c in range(call.n):
                yield _sse(_chunk(call, [{"index": c, "delta": {"role": "assistant",
                                                                 "content": ""},
                                          "logprobs": None, "finish_reason": None}]))
        async for i, out in _merged(streams):
            choices = [_delta_choice(call, i, c, state, out) for c in out.outputs]
            choices = [c for c in choices if c is not None]
            if choices:
                yield _sse(_chunk(call, choices))
            if out.finished:
                finals[i] = out
        if include_usage:
            yield _sse(_chunk(call, [], usage=_usage(call, list(finals.values()))))
        yield "data: [DONE]\n\n"
    except (APIError, RequestError, EngineDeadError) as exc:
        yield _sse(error_body(500, str(exc)))
    finally:
        state.request_ended()


def _delta_choice(call: _Call, prompt_index: int, c: CompletionOutput,
                  state: ServerState, out: RequestOutput) -> dict | None:
    key = prompt_index * call.n + c.index
    first = key not in call.sent_text
    sent_text = call.sent_text.get(key, 0)
    sent_tokens = call.sent_tokens.get(key, 0)
    text = c.text[sent_text:]
    echoed = _echo_text(call, state, prompt_index) if call.echo else ""
    if first:
        text = echoed + text
    new_tokens = c.token_ids[sent_tokens:]
    if not text and not c.finish_reason and not (new_tokens and c.logprobs):
        return None
    call.sent_text[key] = len(c.text)
    logprobs = None
    if c.logprobs is not None:
        logprobs = _logprobs(call, state, new_tokens, c.logprobs[sent_tokens:],
                             len(echoed) + sent_text)
        if first:
            logprobs = _with_echo(call, state, out, logprobs)
        call.sent_tokens[key] = len(c.token_ids)
    finish = c.finish_reason
    if call.kind == "chat":
        delta = {"content": text} if text else {}
        if call.tools is not None:
            delta, finish = call.tools.delta(key, c.text, finish)
            if not delta and finish is None and logprobs is None:
                return None
        return {"index": key, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    choice = {"index": key, "text": text, "logprobs": logprobs, "finish_reason": finish}
    if first and call.prompt_logprobs is not None:
        choice["prompt_logprobs"] = _vllm_prompt_logprobs(state, out, call.prompt_logprobs)
    return choice


def _full_response(call: _Call, finals: list[RequestOutput], state: ServerState) -> dict:
    choices = []
    for i, out in enumerate(finals):
        for c in out.outputs:
            key = i * call.n + c.index
            echoed = _echo_text(call, state, i) if call.echo else ""
            logprobs = (_with_echo(call, state, out, _logprobs(
                call, state, c.token_ids, c.logprobs, len(echoed)))
                if c.logprobs is not None else None)
            if call.kind == "chat":
                message, finish = ({"role": "assistant", "content": c.text}, c.finish_reason)
                if call.tools is not None:
                    message, finish = call.tools.message(c.text, c.finish_reason)
                choices.append({"index": key, "message": message, "logprobs": logprobs,
                                "finish_reason": finish})
            else:
                choice = {"index": key, "text": echoed + c.text, "logprobs": logprobs,
                          "finish_reason": c.finish_reason}
                if call.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = _vllm_prompt_logprobs(state, out,
                                                                      call.prompt_logprobs)
                choices.append(choice)
    body = _chunk(call, choices, usage=_usage(call, finals))
    body["object"] = "chat.completion" if call.kind == "chat" else "text_completion"
    return body


def _chunk(call: _Call, choices: list[dict], usage: dict | None = None) -> dict:
    body = {"id": call.id,
            "object": "chat.completion.chunk" if call.kind == "chat" else "text_completion",
            "created": call.created, "model": call.model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def _usage(call: _Call, finals: list[RequestOutput]) -> dict:
    prompt = sum(len(ids) for ids in call.prompts_ids)
    completion = sum(len(c.token_ids) for out in finals for c in out.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _logprobs(call: _Call, state: ServerState, token_ids: list[int],
              entries: list[dict[int, float]], text_offset: int) -> dict:
    k = call.params.logprobs or 0
    if call.kind == "chat":
        content = []
        for token, entry in zip(token_ids, entries, strict=False):
            top = list(entry.items())[:k]
            content.append({**_token_info(state, token, entry[token]),
                            "top_logprobs": [_token_info(state, t, lp) for t, lp in top]})
        return {"content": content}
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = text_offset
    for token, entry in zip(token_ids, entries, strict=False):
        piece = _decode(state, [token])
        tokens.append(piece)
        # None: the first prompt token of an echo, which nothing precedes to score it.
        token_logprobs.append(None if entry is None else entry[token])
        top_logprobs.append(None if entry is None else
                            {_decode(state, [t]): lp for t, lp in list(entry.items())[:k]})
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}


def _echo_text(call: _Call, state: ServerState, prompt_index: int) -> str:
    return call.prompts_text[prompt_index] or _decode(state, call.prompts_ids[prompt_index])


def _with_echo(call: _Call, state: ServerState, out: RequestOutput,
               completion: dict) -> dict:
    """With echo, the logprobs cover the echoed prompt's tokens first (offsets from the start
    of the text), as they do at OpenAI and vLLM."""
    if not call.echo:
        return completion
    prompt = _logprobs(call, state, out.prompt_token_ids, out.prompt_logprobs or [], 0)
    return {name: prompt[name] + completion[name] for name in prompt}


def _vllm_prompt_logprobs(state: ServerState, out: RequestOutput, k: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: per prompt token (None for the first) the top-k and the token
    itself, by token id, each with its logprob, its rank (1: the most likely) and its text."""
    result: list[dict | None] = []
    entries, ranks = out.prompt_logprobs or [], out.prompt_logprob_ranks or []
    for token, entry, rank in zip(out.prompt_token_ids, entries, ranks, strict=False):
        if entry is None:
            result.append(None)
            continue
        shown = dict(list(entry.items())[:k])
        shown[token] = entry[token]
        result.append({str(t): {"logprob": lp, "rank": rank if t == token else i + 1,
                                "decoded_token": _decode(state, [t])}
                       for i, (t, lp) in enumerate(shown.items())})
    return result


def _token_info(state: ServerState, token: int, logprob: float) -> dict:
    piece = _decode(state, [token])
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}


def _decode(state: ServerState, ids: list[int]) -> str:
    return state.tokenizer.decode(ids, skip_special_tokens=False)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
