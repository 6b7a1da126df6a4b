"""Events posted as the API server accepts them.

Since kopf sets eventTime, the API server checks an Event as a new-style one: its message at
most 1024 bytes (NoteLengthLimit, counted in UTF-8 bytes by Go's len). kopf shortens messages
by characters, so one of fewer than 1024 characters but more bytes (a crash log's tail in
another script) was refused with a 422 and the Warning was lost with only a log line.
"""

from __future__ import annotations

from typing import Any

import kopf

MESSAGE_BYTES = 1024
CUT = "..."


def fit(message: str, limit: int = MESSAGE_BYTES) -> str:
    """The message within `limit` UTF-8 bytes: its start and its end around "...", as kopf
    cuts, with no character split."""
    data = message.encode()
    if len(data) <= limit:
        return message
    room = limit - len(CUT)
    head = data[:room // 2].decode(errors="ignore")
    tail = data[len(data) - (room - room // 2):].decode(errors="ignore")
    return f"{head}{CUT}{tail}"


def post(obj: Any, kind: str, reason: str, message: str) -> None:
    """kopf.event with a message the API server takes whatever its length."""
    kopf.event(obj, type=kind, reason=reason, message=fit(message))
