"""What the bench tests share: dry runs of the GPU suite's stages."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tokenmill.engine.cli import build_parser


@pytest.fixture(scope="session")
def gpu_dry_run(tmp_path_factory) -> Callable[[str], dict[str, Any]]:
    """Run a stage of `tokenmill bench gpu` as a dry run (one tiny model made for all of
    them) and return the JSON it wrote."""
    out = tmp_path_factory.mktemp("gpu-suite")

    def run(stage: str) -> dict[str, Any]:
        args = build_parser().parse_args([
            "bench", "gpu", stage, "--dry-run", "--out", str(out),
            "--model-dir", str(out / "model"), "--no-progress"])
        assert args.func(args) == 0
        return json.loads((out / f"gpu-dry-run-{stage}.json").read_text())

    return run
