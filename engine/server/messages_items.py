"""A finished chat completion body in the Messages API's shapes: the message with its content
blocks (thinking, text, tool_use), its stop reason and its usage."""

from __future__ import annotations

import json
from typing import Any


def message_shell(message_id: str, model: str, input_tokens: int) -> dict[str, Any]:
    """The message before any content, as message_start sends it."""
    return {"id": message_id, "type": "message", "role": "assistant", "content": [],
            "model": model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}


def finished_message(shell: dict[str, Any], chat: dict[str, Any],
                     stop_sequences: list[str] | None) -> dict[str, Any]:
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": tool_input(call["function"]["arguments"])})
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("stop_reason"),
                                   stop_sequences or [])
    return {**shell, "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": anthropic_usage(chat["usage"])}


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as tool_use's input object; text that is not a JSON object is
    kept whole under "arguments"."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def stop_reason(finish: str | None, stopped_by: str | int | None,
                stop_sequences: list[str]) -> tuple[str | None, str | None]:
    """The chat finish reason (and vLLM's stop_reason) as the Messages API's stop_reason and
    stop_sequence."""
    if finish == "length":
        return "max_tokens", None
    if finish == "tool_calls":
        return "tool_use", None
    if isinstance(stopped_by, str) and stopped_by in stop_sequences:
        return "stop_sequence", stopped_by
    return ("end_turn", None) if finish is not None else (None, None)


def anthropic_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Chat usage in the Messages API's terms: the prompt tokens the prefix cache held are
    cache reads, the rest input tokens (their sum is the prompt)."""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": usage["prompt_tokens"] - cached,
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
