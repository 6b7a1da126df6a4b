"""What a streaming parser holds back: the end of the text so far that may yet grow into a
marker (a tool-call or thinking tag, a harmony token), so no half-written tag reaches a client as
plain text."""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_length(text: str, markers: Iterable[str]) -> int:
    """The length of the longest end of `text` that begins one of `markers` (0 if none)."""
    markers = tuple(markers)
    longest = max((len(marker) for marker in markers), default=1) - 1
    for size in range(min(longest, len(text)), 0, -1):
        tail = text[-size:]
        if any(marker.startswith(tail) for marker in markers):
            return size
    return 0
