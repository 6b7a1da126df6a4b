"""Keep what exists before a generation run out of the garbage collector's full passes.

A full (oldest-generation) pass walks every tracked object in the process: the model's
modules, the tokenizer, torch's and transformers' own. The objects a step makes (outputs,
token lists) trigger such passes now and then, each one a pause of the whole engine loop.
`gc.freeze()` moves what exists into a permanent generation the collector skips, and
`gc.unfreeze()` gives it back afterwards, so an engine dropped after the run is still
collected. `tokenmill serve` freezes its start-up heap for good instead (server/state.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the block, then unfreeze it. A heap already frozen when the block
    starts (by the caller, or a server) is left as it is. Garbage that exists at the start is
    collected after the block, not during it."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
