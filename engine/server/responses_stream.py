"""A streamed response as the Responses API's server-sent events, built from the streamed chat
chunks of the same request.

The reply's parts (its thinking, its text, each function call) become output items in the
order they come: an item is added, its text or arguments arrive as deltas, and it is done
(with its whole text) when the next part starts or the reply ends. The stream opens with
`response.created` and `response.in_progress` and ends with `response.completed`, whose
response has status `incomplete` where max_output_tokens cut the reply (as vLLM sends it; the
openai client's stream helper finishes only on `response.completed`). Every event carries its
`sequence_number`, and each is sent with its `event:` line as OpenAI sends them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tokenmill.engine.server import responses_items as shapes
from tokenmill.engine.server.rendering import sse


@dataclass
class _Item:
    """The output item being streamed."""

    kind: str  # "message", "reasoning" or "function_call"
    index: int
    id: str
    text: str = ""  # the message's or the thinking's text, or the call's arguments
    call_id: str | None = None
    name: str | None = None
    logprobs: list[dict] = field(default_factory=list)


class ResponseEvents:
    """The events of one response; feed it the chat chunks' bodies in order."""

    def __init__(self, shell: dict[str, Any], count_tokens: Callable[[str], int]):
        self.shell = shell
        self.count_tokens = count_tokens
        self.sequence = 0
        self.output: list[dict] = []  # finished items
        self.current: _Item | None = None
        self.calls: dict[int, _Item] = {}  # the chat tool call's index -> its item
        self.pending_logprobs: list[dict] = []  # for the text delta they belong to
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def opening(self) -> Iterator[bytes]:
        yield self._event("response.created", response=self.shell)
        yield self._event("response.in_progress", response=self.shell)

    def chat_chunk(self, body: dict[str, Any]) -> Iterator[bytes]:
        if body.get("usage") is not None:
            self.usage = body["usage"]
        for choice in body["choices"]:
            delta = choice["delta"]
            self.pending_logprobs += (choice.get("logprobs") or {}).get("content") or []
            if delta.get("reasoning"):
                yield from self._text("reasoning", delta["reasoning"])
            if delta.get("content"):
                yield from self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                yield from self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def closing(self, finished: Callable[[dict[str, Any]], Any] | None = None
                ) -> Iterator[bytes]:
        """The last items' end and response.completed, its response handed to `finished`
        first (to be stored before the client can ask for it)."""
        yield from self._close()
        if not self.output:  # an empty reply is still one (empty) message
            yield from self._open("message")
            yield from self._close()
        incomplete = self.finish_reason == "length"
        usage = self.usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                               "prompt_tokens_details": {"cached_tokens": 0}}
        thought = "".join(part["text"] for item in self.output if item["type"] == "reasoning"
                          for part in item["content"])
        final = shapes.finish(self.shell, self.output, usage, incomplete,
                              self.count_tokens(thought) if thought else 0)
        if finished is not None:
            finished(final)
        yield self._event("response.completed", response=final)

    def error(self, message: str) -> bytes:
        error = {"code": "server_error", "message": message}
        return (self._event("error", param=None, **error)
                + self._event("response.failed", response={**self.shell, "status": "failed",
                                                           "error": error}))

    # ---- items ----------------------------------------------------------------------------

    def _text(self, kind: str, text: str) -> Iterator[bytes]:
        if self.current is None or self.current.kind != kind:
            yield from self._close()
            yield from self._open(kind)
        item = self.current
        item.text += text
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if kind == "reasoning":
            yield self._event("response.reasoning_text.delta", **where, delta=text)
            return
        logprobs, self.pending_logprobs = self.pending_logprobs, []
        item.logprobs += logprobs
        yield self._event("response.output_text.delta", **where, delta=text, logprobs=logprobs)

    def _tool_call(self, call: dict[str, Any]) -> Iterator[bytes]:
        function = call.get("function") or {}
        if call["index"] not in self.calls:
            yield from self._close()
            yield from self._open("function_call", call_id=call["id"], name=function["name"])
            self.calls[call["index"]] = self.current
        item = self.calls[call["index"]]
        if function.get("arguments"):
            item.text += function["arguments"]
            yield self._event("response.function_call_arguments.delta", item_id=item.id,
                              output_index=item.index, delta=function["arguments"])

    def _open(self, kind: str, call_id: str | None = None,
              name: str | None = None) -> Iterator[bytes]:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = self.current = _Item(kind, len(self.output), shapes.new_item_id(prefix),
                                    call_id=call_id, name=name)
        yield self._event("response.output_item.added", output_index=item.index,
                          item=self._shape(item, "in_progress", added=True))
        if kind != "function_call":
            part = (shapes.output_text("", []) if kind == "message"
                    else {"type": "reasoning_text", "text": ""})
            yield self._event("response.content_part.added", item_id=item.id,
                              output_index=item.index, content_index=0, part=part)

    def _close(self) -> Iterator[bytes]:
        item, self.current = self.current, None
        if item is None:
            return
        where = {"item_id": item.id, "output_index": item.index}
        # The last item closes with the reply: max_output_tokens cut it, whichever kind it is.
        status = "incomplete" if self.finish_reason == "length" else "completed"
        done = self._shape(item, status)
        if item.kind == "function_call":
            yield self._event("response.function_call_arguments.done", **where,
                              name=item.name, arguments=item.text)
        elif item.kind == "message":
            yield self._event("response.output_text.done", **where, content_index=0,
                              text=item.text, logprobs=item.logprobs)
            yield self._event("response.content_part.done", **where, content_index=0,
                              part=done["content"][0])
        else:
            yield self._event("response.reasoning_text.done", **where, content_index=0,
                              text=item.text)
            yield self._event("response.content_part.done", **where, content_index=0,
                              part=done["content"][0])
        self.output.append(done)
        yield self._event("response.output_item.done", output_index=item.index, item=done)

    @staticmethod
    def _shape(item: _Item, status: str, added: bool = False) -> dict[str, Any]:
        if item.kind == "function_call":
            return shapes.function_call_item(item.id, item.call_id, item.name,
                                             "" if added else item.text, status)
        text = None if added else item.text
        if item.kind == "message":
            return shapes.message_item(item.id, text, status, item.logprobs)
        return shapes.reasoning_item(item.id, text, status)

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n".encode() + sse(body)
