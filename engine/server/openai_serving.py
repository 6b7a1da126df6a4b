"""/v1/completions and /v1/chat/completions: requests checked and admitted to the engine, their
outputs collected or streamed (the JSON bodies are rendered by rendering.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.contract.pooling import TASK_LACKS, TASK_SERVED
from tokenmill.engine.core import (
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
    prompt_truncation,
)
from tokenmill.engine.core.errors import (
    EngineDeadError,
    RequestError,
    SamplingParamsError,
)
from tokenmill.engine.frontend.async_engine import RequestStream
from tokenmill.engine.frontend.content_format import in_content_format
from tokenmill.engine.server.adapters import resolve_model
from tokenmill.engine.server.beam_requests import beam_params, start_beam_searches
from tokenmill.engine.server.errors import APIError, admission_error, client_closed, error_body
from tokenmill.engine.server.images import request_images
from tokenmill.engine.server.prompt_embeds import decode_prompt_embeds
from tokenmill.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.engine.server.reasoning import REASONING_PARSERS, ReplyReasoning, RequestedThinking
from tokenmill.engine.server.rendering import Call, chunk, delta_choice, full_response, sse, usage
from tokenmill.engine.server.request_log import log_output, log_request
from tokenmill.engine.server.request_template import request_template
from tokenmill.engine.server.state import ServerState, check_ready
from tokenmill.engine.server.tools import (
    ReplyToolCalls,
    ToolPlan,
    ToolRequestError,
    plan_tools,
    sampling_for_tools,
)

log = logging.getLogger(__name__)


async def create_completion(body: CompletionRequest, request: Request,
                            state: ServerState) -> Any:
    adapter = check_serving(state, body.model)
    if not state.has_tokenizer and (body.echo or body.use_beam_search):
        field = "echo" if body.echo else "use_beam_search"
        raise APIError(400, f"{field} needs the tokenizer, which the server did not load "
                            "(--skip-tokenizer-init)", param=field)
    embeds = await _prompt_embeds(body, state)
    prompts = body.prompts()
    ids = [truncated(_tokenize(state, p, body.add_special_tokens), body.truncate_prompt_tokens,
                     state) for p in prompts]
    if body.truncate_prompt_tokens is not None:  # echo shows the prompt that ran
        prompts = [list(p) for p in ids]
    # Each prompt given as embeddings holds a place per row (its token ids are nobody's).
    ids = [rows.token_ids for rows in embeds] + ids
    max_tokens = body.max_tokens if body.max_tokens is not None else _room(state, ids, "prompt")
    params = _params(body, 1 if body.prompt_only else max_tokens, body.logprobs, state)
    constraint_field = body.constraint_field()
    beam = beam_params(body, params, constraint_field)
    await _compile_constraint(state, params, constraint_field)
    model = adapter or state.options.served_model_name
    if embeds and beam is not None:
        raise APIError(400, "use_beam_search: beam search takes prompts of tokens, not "
                            "embeddings", param="use_beam_search")
    call = Call("completion", f"cmpl-{uuid.uuid4().hex}", model, body.n,
                [None] * len(embeds) + [p if isinstance(p, str) else None for p in prompts],
                ids, params, prompts_embeds=[*embeds, *[None] * len(prompts)],
                cache_salt=body.cache_salt, echo=body.echo, prompt_only=body.prompt_only,
                prompt_logprobs=body.prompt_logprobs, lora_name=adapter,
                continuous_usage=body.continuous_usage,
                tokens_as_ids=_tokens_as_ids(body, state), priority=body.priority,
                return_token_ids=bool(body.return_token_ids), beam=beam)
    return await _run(call, body.stream, body.include_usage, request, state)


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 state: ServerState) -> Any:
    call = await chat_call(body, state)
    return await _run(call, body.stream, body.include_usage, request, state)


async def chat_call(body: ChatCompletionRequest, state: ServerState,
                    id_prefix: str = "chatcmpl-") -> Call:
    """A checked chat request as a Call, its prompt rendered and its grammar compiled (the
    Responses API runs its requests through here too)."""
    adapter = check_serving(state, body.model)
    plan = _tool_plan(body, state)
    variables = body.template_variables()
    try:
        ids = chat_ids(state, body.conversation(), plan.template_tools,
                       add_generation_prompt=body.add_generation_prompt,
                       continue_final_message=body.continue_final_message,
                       add_special_tokens=body.add_special_tokens,
                       template_kwargs=variables,
                       chat_template=request_template(body, state), documents=body.documents)
    except ValueError as exc:
        raise APIError(400, f"messages: {exc}", param="messages") from exc
    images = await request_images(body.image_urls(), state, body.mm_processor_kwargs)
    if images:
        ids = with_images(state, ids, images, body.truncate_prompt_tokens)
    ids = truncated(ids, body.truncate_prompt_tokens, state)
    max_tokens = body.max_completion_tokens or body.max_tokens or _room(state, [ids],
                                                                          "messages")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    try:
        state.engine.check_logprobs(logprobs, "top_logprobs")
    except RequestError as exc:
        raise APIError(400, str(exc), param=exc.param) from exc
    params = _sampling_for_tools(_params(body, max_tokens, logprobs, state), plan)
    constraint_field = body.constraint_field() or "tool_choice"
    beam = beam_params(body, params, constraint_field)
    await _compile_constraint(state, params, constraint_field)
    model = adapter or state.options.served_model_name
    reasoning = _reasoning(state, params, variables)
    if reasoning is not None and reasoning.thinking.keeps_special_tokens:
        params = dataclasses.replace(params, skip_special_tokens=False)
    role = _reply_role(body, state)
    return Call("chat", f"{id_prefix}{uuid.uuid4().hex}", model, body.n, [None], [ids], params,
                cache_salt=body.cache_salt, lora_name=adapter,
                tools=ReplyToolCalls(plan) if plan.parser is not None else None,
                reasoning=reasoning, include_reasoning=body.include_reasoning,
                prompt_logprobs=body.prompt_logprobs,
                continuous_usage=body.continuous_usage,
                tokens_as_ids=_tokens_as_ids(body, state), priority=body.priority,
                return_token_ids=bool(body.return_token_ids), role=role,
                echoed=body.echoed(role), images=images, beam=beam)


def with_images(state: ServerState, ids: list[int], images: list[Any],
                 truncate: int | None) -> list[int]:
    """The prompt with each image's placeholder expanded to the rows it takes; 400 where the
    placeholders do not match the images, or where truncating would cut them."""
    if truncate is not None:
        raise APIError(400, "truncate_prompt_tokens cannot cut a prompt with images",
                       param="truncate_prompt_tokens")
    try:
        return state.engine.engine.images.place(ids, images)[0]
    except RequestError as exc:
        raise APIError(400, f"messages: {exc}", param="messages") from exc


def _reply_role(body: ChatCompletionRequest, state: ServerState) -> str:
    """--response-role where the prompt asks for a reply (vLLM's rule); else the role of the
    last message, which the reply continues."""
    if body.add_generation_prompt:
        return state.options.response_role
    return body.messages[-1].role


def _tokens_as_ids(body: Any, state: ServerState) -> bool:
    """The request's return_tokens_as_token_ids, else the server's flag."""
    asked = body.return_tokens_as_token_ids
    if not state.has_tokenizer:  # no token has a text: each is named by its id
        return True
    return state.options.return_tokens_as_token_ids if asked is None else asked


def _reasoning(state: ServerState, params: SamplingParams,
               template_kwargs: dict | None) -> ReplyReasoning | None:
    """The reply's thinking splitter under --reasoning-parser; none for a constrained reply
    (a schema, a forced tool call), whose grammar holds from its first token, so it can't
    think first, nor where the request leaves thinking off for a model that thinks only when
    asked (`template_kwargs`: its chat_template_kwargs)."""
    parser = state.options.reasoning_parser
    if parser is None or params.structured_outputs is not None:
        return None
    thinking = REASONING_PARSERS[parser]
    if isinstance(thinking, RequestedThinking):
        thinking = thinking.for_request(template_kwargs)
    return None if thinking is None else ReplyReasoning(thinking)


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

# The routes that serve a model of each task.
TASK_ROUTES = {"generate": "/v1/completions, /v1/chat/completions or /v1/responses",
               "embed": "/v1/embeddings, /score or /rerank",
               "classify": "/classify, or /score and /rerank"}


def check_serving(state: ServerState, model: str | None, task: str = "generate") -> str | None:
    """check_model, then 400 if the model is served for another task (generation,
    embeddings, classification), 503 while too many requests wait; returns the adapter (or
    None)."""
    adapter = check_model(state, model)
    if state.task != task:
        name = model or state.options.served_model_name
        hint = ("; serve an embedding model, or this one with --runner pooling"
                if state.task == "generate" and task == "embed"
                else f"; use {TASK_ROUTES[state.task]}")
        raise APIError(400, f"the model {name!r} is served for {TASK_SERVED[state.task]}: it "
                            f"{TASK_LACKS[task]}{hint}", param="model")
    if state.engine.num_waiting >= state.options.max_waiting_requests:
        raise APIError(503, f"too many requests waiting ({state.engine.num_waiting}); "
                            "retry later", headers={"Retry-After": "1"})
    return adapter


def check_model(state: ServerState, model: str | None) -> str | None:
    """503 unless the model is loaded and serving; 404 for a name this server does not serve.
    Returns the LoRA adapter `model` names, None for the base model."""
    check_ready(state)
    return resolve_model(state, model)


async def _prompt_embeds(body: CompletionRequest, state: ServerState) -> list[Any]:
    """The request's prompts given as embeddings, decoded and prepared by the engine off the
    event loop, each cut to its last truncate_prompt_tokens rows."""
    if body.prompt_embeds is None:
        return []
    return await asyncio.to_thread(decode_prompt_embeds, body.prompt_embeds,
                                   state.engine.engine, body.truncate_prompt_tokens)


def truncated(ids: list[int], keep: int | None, state: ServerState) -> list[int]:
    """vLLM's truncate_prompt_tokens on the served model (core/prompt_truncation.py)."""
    return prompt_truncation.truncated(ids, keep, state.loaded_tokenizer, state.max_model_len)


def _tokenize(state: ServerState, prompt: str | list[int],
              add_special_tokens: bool = True) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        if not state.has_tokenizer:
            raise APIError(400, "prompt: a text prompt needs the tokenizer, which the server "
                                "did not load (--skip-tokenizer-init): send token ids",
                           param="prompt")
        return state.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    return list(prompt)


def chat_ids(state: ServerState, conversation: list[dict[str, Any]],
             tools: list[dict] | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, add_special_tokens: bool = False,
             template_kwargs: dict[str, Any] | None = None, chat_template: str | None = None,
             documents: list[dict[str, Any]] | None = None) -> list[int]:
    """The conversation through the chat template, tokenized (as transformers does with
    tokenize=True: the template writes the special tokens, so none are added by default),
    each image's marker expanded to the tokens its rows take.
    `template_kwargs` are extra variables of the template (checked by ChatTemplateFields),
    over the server's --default-chat-template-kwargs; `chat_template`, the request's own
    (request_template.py), in place of the server's; `documents`, a retrieval template's.

    ValueError for a message the template rejects, or an image for a model that reads
    none."""
    images = any(part.get("type") == "image" for message in conversation
                 if isinstance(message.get("content"), list) for part in message["content"])
    conversation = in_content_format(conversation, state.content_format(images, chat_template),
                                     state.image_placeholder)
    try:
        text = state.tokenizer.apply_chat_template(
            conversation, tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=False,
            chat_template=chat_template or state.options.chat_template,
            **{**state.options.default_chat_template_kwargs, **(template_kwargs or {})})
    except Exception as exc:  # template errors (e.g. role order) are the caller's to fix
        raise ValueError(f"the chat template rejected the messages: {exc}") from exc
    if images:  # each image's marker written out as the model's processor writes it
        text = state.engine.engine.images.expand_text(text)
    return state.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _room(state: ServerState, prompts: list[list[int]], field: str) -> int:
    """Default max_tokens when none is given: what the context leaves after the prompt, at
    most the max_new_tokens of the generation config or its override; a 400 naming the
    prompt's field (prompt, messages) where it leaves nothing."""
    longest = max(len(p) for p in prompts)
    if longest >= state.max_model_len:
        raise APIError(400, f"this model's maximum context length is {state.max_model_len} "
                            f"tokens, but the prompt has {longest} tokens", param=field)
    room = state.max_model_len - longest
    return min(room, int(state.sampling_defaults.get("max_new_tokens", room)))


def _params(body: Any, max_tokens: int, logprobs: int | None,
            state: ServerState) -> SamplingParams:
    try:
        return body.sampling_params(max_tokens, logprobs, state.sampling_defaults)
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


async def start_requests(state: ServerState, requests: list[tuple[str, list[int], dict]],
                         field: str) -> list[RequestStream]:
    """Admit one call's engine requests, (id, prompt ids, add_request keywords) each, as one
    request in flight until collect() or the stream ends it. A request the engine refuses
    closes the others and is an HTTP error; a RequestError names `field` unless it names its
    own."""
    state.request_started()
    try:
        streams = await state.engine.add_requests(requests)
    except BaseException as exc:
        state.request_ended()
        if (error := admission_error(exc, field)) is not None:
            raise error from exc
        raise
    return streams


# ---- running ------------------------------------------------------------------------------

async def _run(call: Call, stream: bool, include_usage: bool, request: Request,
               state: ServerState) -> Any:
    streams = await start(call, stream, state)
    if stream:
        include_usage = include_usage or state.options.force_include_usage
        return StreamingResponse(_stream(call, streams, include_usage, state),
                                 media_type="text/event-stream")
    finals = await collect(streams, request, state)
    if finals is None:
        return client_closed()
    return JSONResponse(full_response(call, finals, state))


async def start(call: Call, stream: bool, state: ServerState) -> list[RequestStream]:
    """Admit the call's requests: one request in flight until collect() or chat_chunks()
    ends it. A stream's engine requests report what each step added (_merged joins it), so
    the engine's work per step does not grow with the length of the replies; the others
    report once, finished, as vLLM's do."""
    field = "prompt" if call.kind == "completion" else "messages"
    if call.beam is not None:
        streams = await start_beam_searches(call, state, field)
        log_request(call, state)
        return streams
    kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    options = {"params": dataclasses.replace(call.params, output_kind=kind),
               "cache_salt": call.cache_salt,
               "lora_name": call.lora_name, "priority": call.priority,
               **({"images": call.images} if call.images else {})}
    prompts = [ids if embeds is None else embeds
               for ids, embeds in zip(call.prompts_ids, call.embeds_or_none(), strict=True)]
    streams = await start_requests(
        state, [(f"{call.id}-{i}", prompt, options) for i, prompt in enumerate(prompts)],
        field)
    if state.tracer is not None:
        for s in streams:
            state.tracer.begin(s.request_id, call.model, call.params)
    log_request(call, state)
    log.info("request admitted", extra={"id": call.id, "prompts": len(call.prompts_ids),
                                        "n": call.n, "max_tokens": call.params.max_tokens,
                                        "stream": stream})
    return streams


async def collect(streams: list[RequestStream], request: Request | None,
                  state: ServerState) -> list[RequestOutput] | None:
    """The final outputs of started requests, or None if the client went away (with no
    `request`, a background run's, nobody is watched: cancelling the caller aborts them)."""
    try:
        return await _collect(streams, request, state)
    except EngineDeadError as exc:  # the loop died under this request; the server exits
        raise APIError(503, str(exc)) from exc
    finally:
        state.request_ended()


async def _merged(streams: list[RequestStream], state: ServerState,
                  deltas: bool = False) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Each prompt's output so far, as its streams report: deltas joined in place into one
    object a prompt (read it before the next), or a request's one final output; closes every
    stream on exit. With --enable-log-outputs a finished output is logged, and each of a
    stream's `deltas` too."""
    sofar: dict[int, RequestOutput] = {}

    def joined(i: int, delta: RequestOutput) -> RequestOutput:
        if deltas:
            log_output(delta, state, delta=True)
        if i in sofar:
            sofar[i].extend(delta)
        else:
            sofar[i] = delta
        if sofar[i].finished:
            log_output(sofar[i], state)
            if state.tracer is not None:
                state.tracer.end(sofar[i])
        return sofar[i]

    if len(streams) == 1:  # one prompt, the usual call: no task and queue in between
        try:
            async for out in streams[0]:
                yield 0, joined(0, out)
        finally:
            await streams[0].aclose()
            _forget_traces(streams, state)
        return
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
                yield i, joined(i, item)
    finally:
        for task in tasks:
            task.cancel()
        for s in streams:
            await s.aclose()
        _forget_traces(streams, state)


def _forget_traces(streams: list[RequestStream], state: ServerState) -> None:
    """No span for a request that ended without a final output (its client went away)."""
    if state.tracer is not None:
        for s in streams:
            state.tracer.forget(s.request_id)


async def _collect(streams: list[RequestStream], request: Request | None,
                   state: ServerState) -> list[RequestOutput] | None:
    """Final outputs in prompt order, or None if the client went away (requests aborted)."""
    finals: dict[int, RequestOutput] = {}

    async def consume() -> None:
        async for i, out in _merged(streams, state):
            if out.finished:
                finals[i] = out

    if request is None:  # nobody to watch: cancelling the caller cancels the reading
        await consume()
    else:
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


async def chat_chunks(call: Call, streams: list[RequestStream], include_usage: bool,
                      state: ServerState) -> AsyncIterator[dict]:
    """The bodies of a started call's streamed chunks, as they come, each with one choice
    (clients read `chunk.choices[0]`); a chat call's first chunk of each choice carries the
    role; with include_usage the last carries the usage and no choice."""
    finals: dict[int, RequestOutput] = {}
    latest: dict[int, RequestOutput] = {}  # each prompt's newest output, for usage so far

    def running_usage() -> dict | None:
        return usage(call, list(latest.values())) if call.continuous_usage else None

    try:
        if call.kind == "chat":
            for c in range(call.n):
                first = chunk(call, [{"index": c, "delta": {"role": call.role,
                                                            "content": call.echoed},
                                      "logprobs": None, "finish_reason": None}],
                              usage=running_usage())
                if call.return_token_ids and c == 0:  # vLLM's: on the first chunk
                    first["prompt_token_ids"] = call.prompts_ids[0]
                yield first
        async for i, out in _merged(streams, state, deltas=True):
            latest[i] = out
            for output in out.outputs:  # one choice a chunk, as OpenAI and vLLM send them
                choice = delta_choice(call, i, output, state, out)
                if choice is not None:
                    yield chunk(call, [choice], usage=running_usage())
            if out.finished:
                finals[i] = out
        if include_usage:
            yield chunk(call, [], usage=usage(call, list(finals.values())))
    finally:
        state.request_ended()


async def _stream(call: Call, streams: list[RequestStream], include_usage: bool,
                  state: ServerState) -> AsyncIterator[bytes]:
    try:
        async with contextlib.aclosing(chat_chunks(call, streams, include_usage,
                                                   state)) as bodies:
            async for body in bodies:
                yield sse(body)
        yield b"data: [DONE]\n\n"
    except (APIError, RequestError, EngineDeadError) as exc:
        yield sse(error_body(500, str(exc)))
