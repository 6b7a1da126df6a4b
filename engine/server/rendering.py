"""OpenAI response bodies from engine outputs: whole responses, streamed chunks and their
choices, usage, logprobs in the completions and chat shapes, echo, and vLLM's
prompt_logprobs. Pure functions of a call and its outputs; the routes are in openai_serving.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from tokenmill.engine.core import BeamSearchParams, CompletionOutput, RequestOutput, SamplingParams
from tokenmill.engine.server.reasoning import ReplyReasoning
from tokenmill.engine.server.state import ServerState
from tokenmill.engine.server.text_offsets import ReplyOffsets, prompt_offsets
from tokenmill.engine.server.token_bytes import token_bytes
from tokenmill.engine.server.tools import ReplyToolCalls


@dataclass
class Call:
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
    prompt_only: bool = False  # echo with max_tokens 0: the engine's one token is not shown
    prompt_logprobs: int | None = None  # vLLM's: per choice (a chat's: once), top-k
    tools: ReplyToolCalls | None = None  # parses chat replies into tool calls
    reasoning: ReplyReasoning | None = None  # splits chat replies' thinking from the answer
    include_reasoning: bool = True  # vLLM's: false leaves the split-off thinking out
    lora_name: str | None = None  # the adapter the request runs on (None: the base model)
    continuous_usage: bool = False  # every streamed chunk carries the usage so far
    tokens_as_ids: bool = False  # logprobs name tokens "token_id:ID" (vLLM's option)
    return_token_ids: bool = False  # vLLM's: prompt and choice token ids in the reply
    role: str = "assistant"  # a chat reply's message role
    echoed: str = ""  # a chat reply's text before its own (vLLM's echo)
    priority: int = 0  # under --scheduling-policy priority, lower runs first
    images: list[Any] = field(default_factory=list)  # a chat prompt's, prepared (ImageInputs)
    # Each prompt's embeddings where it was given as embeddings (its ids are placeholders),
    # None where it was given as text or tokens; empty where none was.
    prompts_embeds: list[Any] = field(default_factory=list)
    beam: BeamSearchParams | None = None  # use_beam_search's (beam_requests.py)
    created: int = field(default_factory=lambda: int(time.time()))
    sent_text: dict[int, int] = field(default_factory=dict)
    sent_answer: dict[int, int] = field(default_factory=dict)  # under a reasoning parser
    sent_tokens: dict[int, int] = field(default_factory=dict)
    sent_ids: dict[int, int] = field(default_factory=dict)  # with return_token_ids
    offsets: dict[int, ReplyOffsets] = field(default_factory=dict)  # completions' logprobs
    finished: set[int] = field(default_factory=set)  # choices whose finish_reason is sent

    def embeds_or_none(self) -> list[Any]:
        """Each prompt's embeddings, None for a prompt of tokens."""
        return self.prompts_embeds or [None] * len(self.prompts_ids)


def delta_choice(call: Call, prompt_index: int, c: CompletionOutput,
                  state: ServerState, out: RequestOutput) -> dict | None:
    c = _shown(call, c)
    key = prompt_index * call.n + c.index
    if key in call.finished:  # deltas are joined in place: a finished choice stays in them
        return None
    first = key not in call.sent_text
    sent_text = call.sent_text.get(key, 0)
    sent_tokens = call.sent_tokens.get(key, 0)
    text = c.text[sent_text:]
    echoed = prompt_text(call, state, prompt_index) if call.echo else ""
    if first:
        text = echoed + text
    new_tokens = c.token_ids[sent_tokens:]
    # Without a tokenizer (--skip-tokenizer-init) a reply has no text: each step's tokens
    # are a chunk of their own.
    if not text and not c.finish_reason and not (
            new_tokens and (c.logprobs or not state.has_tokenizer)):
        return None
    call.sent_text[key] = len(c.text)
    logprobs = None
    if c.logprobs is not None:
        offsets = _reply_offsets(call, state, key, prompt_index, echoed, new_tokens)
        logprobs = _logprobs(call, state, new_tokens, c.logprobs[sent_tokens:], offsets)
        if first:
            logprobs = _with_echo(call, state, out, echoed, logprobs)
        call.sent_tokens[key] = len(c.token_ids)
    finish = c.finish_reason
    if call.kind == "chat":
        delta = {"content": text} if text else {}
        if call.reasoning is not None or call.tools is not None:
            delta, finish = _chat_delta(call, key, c.text, sent_text, finish)
            if not delta and finish is None and logprobs is None:
                return None
        choice = {"index": key, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    else:
        choice = {"index": key, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if first and call.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _vllm_prompt_logprobs(state, out, call.prompt_logprobs)
        if first and call.return_token_ids:
            choice["prompt_token_ids"] = prompt_token_ids(call, prompt_index)
    if finish is not None:
        choice["stop_reason"] = c.stop_reason
        call.finished.add(key)
    return _with_ids(call, key, c, choice)


def _shown(call: Call, c: CompletionOutput) -> CompletionOutput:
    """What a choice shows of its output: under echo with max_tokens 0 none of the token the
    engine ran the prompt for, ended as max_tokens ends a choice."""
    if not call.prompt_only:
        return c
    return replace(c, text="", token_ids=[], logprobs=None if c.logprobs is None else [],
                   finish_reason=c.finish_reason and "length", stop_reason=None)


def _with_ids(call: Call, key: int, c: CompletionOutput, choice: dict) -> dict:
    """With return_token_ids, a streamed choice carries the token ids it has not sent yet
    (a chunk held back, its text incomplete, passes them to the next)."""
    if call.return_token_ids:
        choice["token_ids"] = c.token_ids[call.sent_ids.get(key, 0):]
        call.sent_ids[key] = len(c.token_ids)
    return choice


def _chat_delta(call: Call, key: int, text: str, sent_text: int,
                finish: str | None) -> tuple[dict, str | None]:
    """A streamed chat choice's next delta where its reply is parsed: the thinking's new text
    first, then the answer's, through the tool-call parser when there is one."""
    delta: dict = {}
    answer = text
    if call.reasoning is not None:
        thought, answer = call.reasoning.delta(key, text, final=finish is not None)
        if thought and call.include_reasoning:
            delta["reasoning"] = delta["reasoning_content"] = thought
        sent_text = call.sent_answer.get(key, 0)
        call.sent_answer[key] = len(answer)
    if call.tools is not None:
        parsed, finish = call.tools.delta(key, answer, finish)
        return {**delta, **parsed}, finish
    if answer[sent_text:]:
        delta["content"] = answer[sent_text:]
    return delta, finish


def _chat_message(call: Call, text: str, finish: str | None) -> tuple[dict, str | None]:
    """A finished chat choice's message: the answer (with its tool calls, where parsed) and,
    under a reasoning parser, the thinking beside it."""
    thought, answer = (None, text) if call.reasoning is None else call.reasoning.split(text)
    message: dict = {"role": call.role, "content": answer}
    if call.tools is not None:
        message, finish = call.tools.message(answer, finish)
        message["role"] = call.role
    if call.echoed:
        message["content"] = call.echoed + (message["content"] or "")
    if call.reasoning is not None and call.include_reasoning:
        message["reasoning"] = message["reasoning_content"] = thought
    return message, finish


def full_response(call: Call, finals: list[RequestOutput], state: ServerState) -> dict:
    choices = []
    for i, out in enumerate(finals):
        for c in [_shown(call, output) for output in out.outputs]:
            key = i * call.n + c.index
            echoed = prompt_text(call, state, i) if call.echo else ""
            logprobs = None
            if c.logprobs is not None:
                offsets = _reply_offsets(call, state, key, i, echoed, c.token_ids)
                logprobs = _with_echo(call, state, out, echoed,
                                      _logprobs(call, state, c.token_ids, c.logprobs, offsets))
            if call.kind == "chat":
                message, finish = _chat_message(call, c.text, c.finish_reason)
                choice = {"index": key, "message": message, "logprobs": logprobs,
                          "finish_reason": finish, "stop_reason": c.stop_reason}
            else:
                choice = {"index": key, "text": echoed + c.text, "logprobs": logprobs,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if call.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = _vllm_prompt_logprobs(state, out,
                                                                      call.prompt_logprobs)
                if call.return_token_ids:
                    choice["prompt_token_ids"] = prompt_token_ids(call, i)
            if call.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
    body = chunk(call, choices, usage=usage(call, finals))
    body["object"] = "chat.completion" if call.kind == "chat" else "text_completion"
    if call.kind == "chat" and call.return_token_ids:
        body["prompt_token_ids"] = call.prompts_ids[0]
    if call.kind == "chat" and call.prompt_logprobs is not None:
        body["prompt_logprobs"] = _vllm_prompt_logprobs(state, finals[0], call.prompt_logprobs)
    return body


def chunk(call: Call, choices: list[dict], usage: dict | None = None) -> dict:
    body = {"id": call.id,
            "object": "chat.completion.chunk" if call.kind == "chat" else "text_completion",
            "created": call.created, "model": call.model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def usage(call: Call, finals: list[RequestOutput]) -> dict:
    """Token counts, with OpenAI's prompt_tokens_details.cached_tokens: the prompt tokens the
    prefix cache already held (vLLM's --enable-prompt-tokens-details, always on here)."""
    prompt = sum(len(ids) for ids in call.prompts_ids)
    completion = sum(len(_shown(call, c).token_ids) for out in finals for c in out.outputs)
    cached = sum(out.num_cached_tokens for out in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _logprobs(call: Call, state: ServerState, token_ids: list[int],
              entries: list[dict[int, float]], offsets: list[int] | None) -> dict:
    """Logprobs in the chat or the completions shape; `offsets`, a completion's text offsets
    of the tokens (None for a chat, whose logprobs carry none)."""
    k = call.params.logprobs or 0
    if call.kind == "chat":
        content = []
        for token, entry in zip(token_ids, entries, strict=False):
            top = list(entry.items())[:k]
            content.append({**_token_info(call, state, token, _shown_value(entry[token])),
                            "top_logprobs": [_token_info(call, state, t, _shown_value(lp))
                                             for t, lp in top]})
        return {"content": content}
    tokens, token_logprobs, top_logprobs = [], [], []
    for token, entry in zip(token_ids, entries, strict=False):
        tokens.append(_token_name(call, state, token))
        # None: the first prompt token of an echo, which nothing precedes to score it.
        token_logprobs.append(None if entry is None else _shown_value(entry[token]))
        top_logprobs.append(None if entry is None else {
            _token_name(call, state, t): _shown_value(lp) for t, lp in list(entry.items())[:k]})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}


def _shown_value(logprob: float) -> float:
    """A logprob as JSON can carry it: a token ruled out (-inf, under --logprobs-mode
    processed_*) as vLLM shows it, -9999.0."""
    return max(logprob, -9999.0)


def _reply_offsets(call: Call, state: ServerState, key: int, prompt_index: int, echoed: str,
                   token_ids: list[int]) -> list[int] | None:
    """Where a choice's next reply tokens begin in its text (after the echoed prompt); None
    for a chat. The choice's tracker stays with the call: a stream's chunks go on from where
    the one before ended."""
    if call.kind == "chat":
        return None
    tracker = call.offsets.get(key)
    if tracker is None:
        tracker = call.offsets[key] = ReplyOffsets(
            state.loaded_tokenizer, call.prompts_ids[prompt_index], len(echoed),
            call.params.skip_special_tokens)
    return tracker.next(token_ids)


def prompt_text(call: Call, state: ServerState, prompt_index: int) -> str:
    """A prompt's text: as the request gave it, or its token ids (a chat's rendered prompt)
    decoded; none for a prompt given as embeddings."""
    if call.embeds_or_none()[prompt_index] is not None:
        return ""
    if call.prompts_text[prompt_index] is None and not state.has_tokenizer:
        return ""  # --skip-tokenizer-init: token ids, which no text is known for
    return call.prompts_text[prompt_index] or _decode(state, call.prompts_ids[prompt_index])


def prompt_token_ids(call: Call, prompt_index: int) -> list[int] | None:
    """A prompt's token ids as the reply shows them (None for one given as embeddings, as
    vLLM shows it)."""
    if call.embeds_or_none()[prompt_index] is not None:
        return None
    return call.prompts_ids[prompt_index]


def _with_echo(call: Call, state: ServerState, out: RequestOutput, echoed: str,
               completion: dict) -> dict:
    """With echo, the logprobs cover the echoed prompt's tokens first (offsets from the start
    of the text), as they do at OpenAI and vLLM."""
    if not call.echo:
        return completion
    ids = out.prompt_token_ids
    prompt = _logprobs(call, state, ids, out.prompt_logprobs or [],
                       prompt_offsets(state.tokenizer, ids, echoed))
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


def _token_info(call: Call, state: ServerState, token: int, logprob: float) -> dict:
    """A chat logprob: the token's name, and its own bytes (those of part of a character
    where a character is split over tokens, so that the parts join into it; the name's where
    tokens are named by id, as vLLM gives them)."""
    name = _token_name(call, state, token)
    raw = name.encode("utf-8") if call.tokens_as_ids else token_bytes(state.tokenizer)(token)
    return {"token": name, "logprob": logprob, "bytes": list(raw)}


def _token_name(call: Call, state: ServerState, token: int) -> str:
    """A token as logprobs name it: its text, or "token_id:ID" (vLLM's
    return_tokens_as_token_ids, which tells apart tokens whose text is the same)."""
    return f"token_id:{token}" if call.tokens_as_ids else _decode(state, [token])


def _decode(state: ServerState, ids: list[int]) -> str:
    return state.tokenizer.decode(ids, skip_special_tokens=False)


def sse(body: dict) -> bytes:
    """One server-sent event. Every token of every stream is one: orjson writes it several
    times faster than json (UTF-8 as is; a non-string key as its text, as json writes it)."""
    return b"data: " + orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"
