"""vLLM's --limit-mm-per-prompt: how many items of each modality a prompt may carry, written
as JSON ({"image": 4}, or {"image": {"count": 4}}) or as the older image=4,video=0."""

from __future__ import annotations

import json
from typing import Any

FORM = 'a JSON object such as {"image": 0}, or image=0,video=0'


def parse_mm_limits(value: str | dict[str, Any]) -> dict[str, int]:
    """{modality: count}; ValueError saying what is wrong."""
    if isinstance(value, dict):
        given = value
    elif value.strip().startswith("{"):
        try:
            given = json.loads(value)
        except ValueError:
            given = None
        if not isinstance(given, dict):
            raise ValueError(f"must be {FORM}")
    else:
        pairs = [item.partition("=") for item in value.strip().split(",")]
        if not all(key.strip() and sep for key, sep, _ in pairs):
            raise ValueError(f"must be {FORM}")
        given = {key.strip(): count.strip() for key, _, count in pairs}
    limits = {}
    for kind, limit in given.items():
        count = limit.get("count") if isinstance(limit, dict) else limit
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{kind}: {limit!r} is not a count of items")
        limits[kind] = count
    return limits
