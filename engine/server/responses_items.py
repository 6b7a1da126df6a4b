"""The output items of a response (its thinking, its message, its function calls) and the
finished response object, in the shapes of OpenAI's Responses API."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any


def finished_response(shell: dict[str, Any], chat: dict[str, Any],
                      count_tokens: Callable[[str], int]) -> dict[str, Any]:
    """The response of a finished chat completion body: its reply as output items."""
    choice = chat["choices"][0]
    message = choice["message"]
    incomplete = choice["finish_reason"] == "length"
    output = []
    thought = message.get("reasoning")
    if thought:
        output.append(reasoning_item(new_item_id("rs"), thought, "completed"))
    if message.get("content") or not message.get("tool_calls"):
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        output.append(message_item(new_item_id("msg"), message.get("content") or "",
                                   "completed", logprobs))
    for call in message.get("tool_calls") or []:
        output.append(function_call_item(new_item_id("fc"), call["id"],
                                         call["function"]["name"],
                                         call["function"]["arguments"], "completed"))
    if incomplete:  # max_output_tokens cut the last item, whichever kind it is
        output[-1]["status"] = "incomplete"
    return finish(shell, output, chat["usage"], incomplete,
                  count_tokens(thought) if thought else 0)


def finish(shell: dict[str, Any], output: list[dict], chat_usage: dict, incomplete: bool,
           reasoning_tokens: int) -> dict[str, Any]:
    """The shell, done: its output items, its status, and the usage in the Responses shape
    (`reasoning_tokens`: the thinking's text tokenized again)."""
    return {**shell, "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": output,
            "usage": {"input_tokens": chat_usage["prompt_tokens"],
                      "input_tokens_details": {
                          "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
                      "output_tokens": chat_usage["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                      "total_tokens": chat_usage["total_tokens"]}}


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str | None, status: str,
                 logprobs: list[dict] | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [output_text(text, logprobs or [])]}


def output_text(text: str, logprobs: list[dict]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}
