"""OutputSlot: where the engine loop leaves a request's outputs for its asyncio reader.

A reader that falls behind the engine (many streams, one event loop) does not queue a backlog
of one-token outputs: the slot holds one output, the newest, and a reader that missed steps
takes them all at once. A cumulative output already holds every earlier one; delta outputs
are merged (RequestOutput.extend). So under load a streamed chunk carries several tokens, as
vLLM's do, and the loop's work per token shrinks instead of its lag growing; a reader that
keeps up still gets one output per step.
"""

from __future__ import annotations

import asyncio

from tokenmill.engine.core import RequestOutput


class OutputSlot:
    """One request's undelivered output, and the error that ends it; event-loop side only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, merge_deltas: bool = False):
        self._loop = loop
        self._merge_deltas = merge_deltas
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None

    def put(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            self._error = self._error or item
        elif self._output is not None and self._merge_deltas:
            self._output.extend(item)
        else:
            self._output = item
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> RequestOutput:
        """The newest output not taken yet (waiting for one); then the error, raised."""
        while self._output is None and self._error is None:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._output is not None:
            output, self._output = self._output, None
            return output
        raise self._error
