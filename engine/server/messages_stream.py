"""A streamed message as the Messages API's server-sent events, built from the streamed chat
chunks of the same request: message_start, then each content block (thinking, text, each
tool_use) as content_block_start, its deltas and content_block_stop, in the order the reply's
parts come; message_delta with the stop reason and the usage; message_stop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tokenmill.engine.server.messages_items import anthropic_usage, stop_reason
from tokenmill.engine.server.rendering import sse


def event(kind: str, body: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\n" + sse({"type": kind, **body})


class MessageEvents:
    """The events of one message; feed it the chat chunks' bodies in order."""

    def __init__(self, shell: dict[str, Any], stop_sequences: list[str] | None):
        self.shell = shell
        self.stop_sequences = stop_sequences or []
        self.index = -1  # the open block's index
        self.kind: str | None = None  # the open block's type
        self.calls: dict[int, int] = {}  # the chat tool call's index -> its block's index
        self.finish: tuple[str | None, str | int | None] = (None, None)
        self.usage: dict | None = None

    def opening(self) -> Iterator[bytes]:
        yield event("message_start", {"message": self.shell})

    def chat_chunk(self, body: dict[str, Any]) -> Iterator[bytes]:
        if body.get("usage") is not None:
            self.usage = body["usage"]
        for choice in body["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning"):
                yield from self._delta("thinking", {"type": "thinking_delta",
                                                    "thinking": delta["reasoning"]})
            if delta.get("content"):
                yield from self._delta("text", {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                yield from self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish = (choice["finish_reason"], choice.get("stop_reason"))

    def closing(self) -> Iterator[bytes]:
        yield from self._close()
        reason, sequence = stop_reason(*self.finish, self.stop_sequences)
        usage = anthropic_usage(self.usage) if self.usage else {"output_tokens": 0}
        yield event("message_delta", {"delta": {"stop_reason": reason,
                                                "stop_sequence": sequence},
                                      "usage": usage})
        yield event("message_stop", {})

    @staticmethod
    def error(message: str) -> bytes:
        return event("error", {"error": {"type": "api_error", "message": message}})

    def _delta(self, kind: str, delta: dict[str, Any]) -> Iterator[bytes]:
        if self.kind != kind:
            yield from self._close()
            block = ({"type": "text", "text": ""} if kind == "text"
                     else {"type": "thinking", "thinking": "", "signature": ""})
            yield from self._open(kind, block)
        yield event("content_block_delta", {"index": self.index, "delta": delta})

    def _tool_call(self, call: dict[str, Any]) -> Iterator[bytes]:
        function = call.get("function") or {}
        if call["index"] not in self.calls:
            yield from self._close()
            yield from self._open("tool_use", {"type": "tool_use", "id": call["id"],
                                               "name": function["name"], "input": {}})
            self.calls[call["index"]] = self.index
        if function.get("arguments"):
            yield event("content_block_delta", {
                "index": self.calls[call["index"]],
                "delta": {"type": "input_json_delta", "partial_json": function["arguments"]}})

    def _open(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        self.index += 1
        self.kind = kind
        yield event("content_block_start", {"index": self.index, "content_block": block})

    def _close(self) -> Iterator[bytes]:
        if self.kind is not None:
            yield event("content_block_stop", {"index": self.index})
            self.kind = None
