"""Where a step's host time goes in Python: the torch profiler sees ops and CUDA calls, and
lumps the rest (scheduling, step inputs, sampling bookkeeping, detokenizing, outputs) as host
work outside ops. cProfile over a few more steps names those functions."""

from __future__ import annotations

import cProfile
import os
import pstats
from typing import Any

TOP_FUNCTIONS = 15
_SITE = f"site-packages{os.sep}"
# The directory above engine/: file names are shown from there (engine/core/...). Not
# report.REPO_ROOT, which is resolved: cProfile names files by the path they were imported
# from, a symlink to the checkout included (as the GPU machine runs it).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))) + os.sep


def top_python(profiler: cProfile.Profile, steps: int,
               limit: int = TOP_FUNCTIONS) -> list[dict[str, Any]]:
    """The Python functions with the most self time over `steps` steps that `profiler` was
    enabled around (the time in builtins and C methods, torch's ops among them, is the torch
    profiler's to show), per step, most first."""
    table = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(((key, value) for key, value in table.items() if key[0] != "~"),
                  key=lambda item: -item[1][2])[:limit]
    return [{"function": function_name(key), "self_us_per_step": own / steps * 1e6,
             "cumulative_us_per_step": total / steps * 1e6, "calls_per_step": calls / steps}
            for key, (_, calls, own, total, _) in rows]


def function_name(key: tuple[str, int, str]) -> str:
    """'engine/core/engine.py:570(step)' for this repository's files, paths under
    site-packages from the package down."""
    path, line, name = key
    if _SITE in path:
        path = path.split(_SITE, 1)[1]
    elif path.startswith(_ROOT):
        path = path[len(_ROOT):]
    return f"{path}:{line}({name})"
