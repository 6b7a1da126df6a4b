"""The engine's parts and their import directions (docs/architecture.md): the operator and
anything else may read the torch-free contract; the import contracts in pyproject.toml fail
when a forbidden import is added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sysconfig.get_path("scripts")) / "lint-imports"

# Every import below fails if it (or anything it imports) needs torch.
NO_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
import tokenmill.engine
import tokenmill.engine.contract
from tokenmill.engine.contract.config import SUPPORTED, ConfigError, EngineConfig, engine_args
from tokenmill.engine.contract.model_shape import ModelShape
import tokenmill.operator.crd, tokenmill.operator.handlers, tokenmill.operator.manifests
# What `tokenmill download` (an init container) runs.
import tokenmill.engine.models.fetch.hub, tokenmill.engine.models.fetch.s3
from tokenmill.engine.models.source import resolve_model
EngineConfig(model="m", tensor_parallel_size=2)
assert ModelShape(heads=9, kv_heads=3, intermediate_size=1536).problems(2)
assert engine_args(max_num_seqs=8) == ["--max-num-seqs", "8"]
assert "torch" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
"""


def test_the_contract_and_the_operator_import_without_torch():
    result = subprocess.run([sys.executable, "-P", "-c", NO_TORCH], cwd="/",
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_torch_is_really_blocked_by_the_check():
    code = NO_TORCH + "\nimport tokenmill.engine.core.engine\n"
    result = subprocess.run([sys.executable, "-P", "-c", code], cwd="/",
                            capture_output=True, text=True)
    assert result.returncode != 0 and "torch" in result.stderr


def _lint_copy(tmp_path: Path, edits: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports over a copy of the packages with `edits` (file -> line added at its end)."""
    package = tmp_path / "tokenmill"
    for part in ("engine", "operator"):
        shutil.copytree(ROOT / part, package / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for file, line in edits.items():
        with open(package / file, "a") as f:
            f.write("\n" + line + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")
@pytest.mark.parametrize(("file", "line", "broken"), [
    ("engine/execution/runner.py", "from tokenmill.engine.core.request import Sequence",
     "tokenmill.engine.execution.runner -> tokenmill.engine.core.request"),
    ("engine/kernels/attend.py", "from tokenmill.engine.contract import config",
     "Kernels are leaves"),
    ("operator/spec.py", "from tokenmill.engine.models import loader",
     "The operator reads only the engine's torch-free contract"),
    ("engine/server/app.py", "from tokenmill.engine.core.scheduler import Scheduler",
     "tokenmill.engine.server.app -> tokenmill.engine.core.scheduler"),
    ("engine/core/engine.py", "from tokenmill.engine.server import errors",
     "tokenmill.engine.core is not allowed to import tokenmill.engine.server"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path, file, line, broken):
    clean = _lint_copy(tmp_path / "clean", {})
    assert clean.returncode == 0, clean.stdout[-2000:]
    result = _lint_copy(tmp_path / "edited", {file: line})
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout[-2000:]
