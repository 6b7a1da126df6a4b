"""pytest run as a subprocess, its outcomes read back from its junit XML as plain JSON.

A subprocess, so the tests import and set up CUDA on their own, as in CI; junit XML, because
pytest writes it with no plugin (the GPU machine has none to add). The xunit1 flavour names
each test's file, from which the test's node id is rebuilt.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

MESSAGE_CHARS = 400
# -P keeps the working directory (the repository root, whose operator/ would shadow Python's
# operator module) off sys.path.
PYTEST = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q",
          "-o", "junit_family=xunit1"]
OUTCOMES = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}


def run_pytest(root: Path, targets: list[str],
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run pytest in `root` over `targets` (paths or node ids): its exit code, wall time,
    outcome counts and one entry per test."""
    with tempfile.TemporaryDirectory(prefix="tokenmill-junit-") as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        done = subprocess.run([*PYTEST, f"--junit-xml={junit}", *targets], cwd=root, env=env)
        seconds = time.perf_counter() - start
        tests = read_junit(junit) if junit.exists() else []
    return {"pytest_args": targets, "exit_code": done.returncode, "seconds": round(seconds, 3),
            "counts": count_outcomes(tests), "tests": tests}


def passed(part: dict[str, Any]) -> bool:
    """Every test passed or was skipped, and there was at least one (pytest exits 5 on none)."""
    return part["exit_code"] == 0 and bool(part["tests"])


def count_outcomes(tests: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(OUTCOMES.values(), 0)
    for test in tests:
        counts[OUTCOMES[test["outcome"]]] += 1
    return counts


def read_junit(path: Path) -> list[dict[str, Any]]:
    """One {nodeid, outcome, seconds, message} per test case of an xunit1 junit XML file."""
    return [_test(case) for case in ElementTree.parse(path).getroot().iter("testcase")]


def _test(case: ElementTree.Element) -> dict[str, Any]:
    outcome, report = "passed", None
    for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        if (element := case.find(tag)) is not None:
            outcome, report = name, element
            break
    return {"nodeid": _nodeid(case), "outcome": outcome,
            "seconds": float(case.get("time", 0.0)),
            "message": None if report is None else _message(report)}


def _nodeid(case: ElementTree.Element) -> str:
    """path::Class::name[params]; a module that failed to import is its path alone."""
    path, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    if not classname:
        return path or name
    module = path.removesuffix(".py").replace("/", ".")
    classes = classname.removeprefix(module).split(".") if path else [classname]
    return "::".join(part for part in (path, *classes, name) if part)


def _message(element: ElementTree.Element) -> str:
    """pytest's one-line summary (a skip's reason, an exception), with the last `E` line of
    the report where the summary does not hold it (the failed assertion, the missing module)."""
    summary = element.get("message", "")
    details = [line[1:].strip() for line in (element.text or "").splitlines()
               if line.startswith("E ")]
    if not details or details[-1] in summary:
        return _clip(summary, MESSAGE_CHARS)
    half = MESSAGE_CHARS // 2
    return _clip(summary, half) + " | " + _clip(details[-1], MESSAGE_CHARS - half - 3)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 3] + "..."
