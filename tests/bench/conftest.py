"""What the bench tests share: dry runs of the GPU suite's stages, each in a process whose
Python lacks what the GPU machine lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_machine_support import gpu_machine_env


class GPUDryRun:
    """Stages of `tokenmill bench gpu` run dry into one directory (one tiny model made for all
    of them), each at most once, as `python -m tokenmill.engine.cli` would on the GPU machine."""

    def __init__(self, out: Path):
        self.out = out
        self.env = gpu_machine_env(out / "python-without")
        self._done: set[str] = set()

    def __call__(self, stage: str) -> dict[str, Any] | None:
        """Run the stage (once) and return the JSON named after it, if it writes one (bench
        writes one per part: read() them)."""
        if stage not in self._done:
            done = subprocess.run(
                [sys.executable, "-P", "-m", "tokenmill.engine.cli", "bench", "gpu", stage,
                 "--dry-run", "--out", str(self.out), "--model-dir", str(self.out / "model"),
                 "--no-progress"],
                env=self.env, cwd=self.out, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            self._done.add(stage)
        path = self.out / f"gpu-dry-run-{stage}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def read(self, name: str) -> dict[str, Any]:
        return json.loads((self.out / f"gpu-dry-run-{name}.json").read_text())


@pytest.fixture(scope="session")
def gpu_dry_run(tmp_path_factory) -> GPUDryRun:
    return GPUDryRun(tmp_path_factory.mktemp("gpu-suite"))
