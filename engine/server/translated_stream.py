"""The stream of an API translated to chat completions (the Responses API, Anthropic's
Messages API): its events, built from the streamed chat chunks of the same request."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

from tokenmill.engine.core.errors import EngineDeadError, RequestError
from tokenmill.engine.server.errors import APIError


class Events(Protocol):
    def opening(self) -> Iterator[bytes]: ...

    def chat_chunk(self, body: dict) -> Iterator[bytes]: ...

    def error(self, message: str) -> bytes: ...


async def translated_events(events: Events, bodies: AsyncIterator[dict],
                            closing: Callable[[], Iterator[bytes]]) -> AsyncIterator[bytes]:
    """The opening events, each chat chunk's events as the reply comes, then `closing`'s; an
    error mid-way ends the stream with the API's error event."""
    try:
        for event in events.opening():
            yield event
        async with contextlib.aclosing(bodies):
            async for body in bodies:
                for event in events.chat_chunk(body):
                    yield event
        for event in closing():
            yield event
    except (APIError, RequestError, EngineDeadError) as exc:
        yield events.error(str(exc))
