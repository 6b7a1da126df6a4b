"""The responses this server keeps (OpenAI's `store`), in memory: what GET /v1/responses/{id}
returns, what `previous_response_id` continues, and the background responses still running.

The store holds at most `capacity` responses and forgets the least recently used first, so a
server that stores every response (the API's default) holds a bounded amount. Each keeps its
whole conversation (the earlier turns' items, its own input and its output), so a follow-up
reads one entry however long the chain, and a chain outlives the entries it grew from.
Entries live in one server process: behind several replicas, a follow-up must reach the
replica that answered the response it names.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tokenmill.engine.server.errors import APIError


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object, as GET returns it
    input_items: list[dict[str, Any]]  # this request's input, as /input_items lists it
    # Every item so far (earlier turns, this input, this output): what a follow-up continues.
    # None until the response has finished.
    conversation: list[dict[str, Any]] | None = None
    task: asyncio.Task | None = field(default=None, repr=False)  # a background run


class ResponseStore:
    """Responses by id, least recently used forgotten first beyond `capacity` (0: none kept)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        # Background runs, held until they end (an entry forgotten meanwhile still finishes).
        self._running: set[asyncio.Task] = set()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.response["id"]] = entry
        self._entries.move_to_end(entry.response["id"])
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The entry, now the most recently used; 404 naming `param` if none is kept."""
        entry = self._entries.get(response_id)
        if entry is None:
            code = ("previous_response_not_found" if param == "previous_response_id"
                    else "not_found")
            why = ("this server keeps no responses (--max-stored-responses 0)"
                   if not self.enabled else "it was not stored, was deleted, was "
                   "forgotten as the least recently used, or another replica answered it "
                   "(stored responses live in the memory of the server that answered)")
            raise APIError(404, f"no response {response_id!r}: {why}", param=param, code=code)
        self._entries.move_to_end(response_id)
        return entry

    def find_item(self, item_id: str) -> dict[str, Any] | None:
        """An input or output item of a stored response, by its id (an item_reference's)."""
        for entry in reversed(self._entries.values()):
            for item in (*entry.input_items, *entry.response.get("output", ())):
                if item.get("id") == item_id:
                    return item
        return None

    def delete(self, response_id: str) -> StoredResponse:
        entry = self.get(response_id)
        del self._entries[response_id]
        return entry

    def run(self, entry: StoredResponse, task: asyncio.Task) -> None:
        """Hold a background run until it ends."""
        entry.task = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def cancel_all(self) -> None:
        """Stop every background run (the server is shutting down)."""
        for task in list(self._running):
            task.cancel()
