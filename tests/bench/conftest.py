"""What the bench tests share: dry runs of the GPU suite's stages, each in a process whose
Python lacks what the GPU machine lacks, each run once for all of the run's workers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from gpu_machine_support import gpu_machine_env
from process_support import run_directory


class GPUDryRun:
    """Stages of `tokenmill bench gpu` run dry, as `python -m tokenmill.engine.cli` would on
    the GPU machine, each at most once in the whole run: the first worker to need a stage runs
    it into the stage's own directory (under a lock) and every other reads what it wrote."""

    def __init__(self, root: Path, env_directory: Path):
        self.root = root
        self.env = gpu_machine_env(env_directory)

    def directory(self, stage: str) -> Path:
        return self.root / stage

    def __call__(self, stage: str) -> dict[str, Any] | None:
        """Run the stage (once) and return the JSON named after it, if it writes one (bench
        writes one per part: read() them)."""
        out = self.directory(stage)
        with FileLock(f"{out}.lock"):
            if not (out / DONE).exists():
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                done = subprocess.run(
                    [sys.executable, "-P", "-m", "tokenmill.engine.cli", "bench", "gpu", stage,
                     "--dry-run", "--out", str(out), "--model-dir", str(out / "model"),
                     "--no-progress"],
                    env=self.env, cwd=out, capture_output=True, text=True, timeout=300)
                assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
                (out / DONE).touch()
        path = out / f"gpu-dry-run-{stage}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def read(self, name: str) -> dict[str, Any]:
        """The JSON a stage run so far wrote as gpu-dry-run-NAME.json."""
        paths = list(self.root.glob(f"*/gpu-dry-run-{name}.json"))
        assert len(paths) == 1, (name, paths)
        return json.loads(paths[0].read_text())


DONE = ".done"


@pytest.fixture(scope="session")
def gpu_dry_run(tmp_path_factory) -> GPUDryRun:
    return GPUDryRun(run_directory(tmp_path_factory) / "gpu-suite",
                     tmp_path_factory.mktemp("python-without"))
