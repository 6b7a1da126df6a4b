"""`tokenmill bench gpu tests`: which tests each part runs, pytest's outcomes read back as JSON,
and a dry run where the GPU machine's missing packages cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tokenmill.engine.bench.gpu_suite import pytest_report, tests_stage

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = """
import pytest


@pytest.fixture
def broken():
    raise RuntimeError("no such device")


def test_passes():
    pass


def test_fails():
    assert 1 == 2, "x" * 1000


@pytest.mark.skip(reason="needs a CUDA GPU")
def test_skipped():
    pass


def test_errors(broken):
    pass


class TestGroup:
    @pytest.mark.parametrize("n", [1])
    def test_in_class(self, n):
        pass
"""


def _file(target: str) -> str:
    return target.split("::")[0]


def test_a_gpu_runs_every_kernel_test_and_the_equality_file():
    kernels = tests_stage.selection(ROOT, ["kernels"], dry_run=False)
    files = {p.relative_to(ROOT).as_posix()
             for p in (ROOT / "tests/device_kernels").glob("test_*.py")}
    assert set(kernels) == files - {tests_stage.EQUALITY}
    assert tests_stage.selection(ROOT, ["equality"], dry_run=False) == [tests_stage.EQUALITY]
    both = tests_stage.selection(ROOT, tests_stage.PARTS, dry_run=False)
    assert set(both) == files


def test_a_dry_run_takes_a_few_tests_of_the_same_files():
    for part in tests_stage.PARTS:
        real = tests_stage.selection(ROOT, [part], dry_run=False)
        dry = tests_stage.selection(ROOT, [part], dry_run=True)
        assert dry and {_file(t) for t in dry} <= set(real)


def test_outcomes_are_read_per_test_from_pytests_junit_xml(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    part = pytest_report.run_pytest(tmp_path, ["test_sample.py"])
    assert part["exit_code"] == 1
    assert part["counts"] == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1}
    assert part["seconds"] > 0
    outcomes = {t["nodeid"]: t for t in part["tests"]}
    assert {n: t["outcome"] for n, t in outcomes.items()} == {
        "test_sample.py::test_passes": "passed",
        "test_sample.py::test_fails": "failed",
        "test_sample.py::test_skipped": "skipped",
        "test_sample.py::test_errors": "error",
        "test_sample.py::TestGroup::test_in_class[1]": "passed",
    }
    failure = outcomes["test_sample.py::test_fails"]["message"]
    assert failure.startswith("AssertionError: xxx") and "assert 1 == 2" in failure
    assert len(failure) <= pytest_report.MESSAGE_CHARS
    assert "needs a CUDA GPU" in outcomes["test_sample.py::test_skipped"]["message"]
    assert "no such device" in outcomes["test_sample.py::test_errors"]["message"]
    assert outcomes["test_sample.py::test_passes"]["message"] is None
    assert all(t["seconds"] >= 0 for t in part["tests"])


def test_a_run_that_collects_nothing_is_not_a_pass(tmp_path):
    (tmp_path / "test_empty.py").write_text("")
    part = pytest_report.run_pytest(tmp_path, ["test_empty.py"])
    assert part["exit_code"] == 5 and part["tests"] == []
    assert not pytest_report.passed(part)


def test_the_summary_misses_the_target_when_pytest_could_not_start(tmp_path):
    """A flag pytest does not know (an absent plugin's) runs nothing and fails nothing: the
    summary still says the tests stage missed."""
    from tokenmill.engine.bench.gpu_suite import summary

    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    part = pytest_report.run_pytest(tmp_path, ["test_one.py", "--no-such-flag"])
    result = {"parts": {"kernels": part}, **tests_stage.totals({"kernels": part})}
    [(_, counts, verdict)] = summary._tests(result)
    assert part["exit_code"] != 0 and counts == "0 / 0 / 0 / 0"
    assert verdict == "no failure: missed"
    good = pytest_report.run_pytest(tmp_path, ["test_one.py"])
    result = {"parts": {"kernels": good}, **tests_stage.totals({"kernels": good})}
    assert summary._tests(result)[0][2] == "no failure: met"


def test_dry_run_needs_none_of_the_packages_the_gpu_machine_lacks(gpu_dry_run):
    check = subprocess.run([sys.executable, "-P", "-c", "import moto"], env=gpu_dry_run.env,
                           capture_output=True, text=True)
    assert "No module named 'moto'" in check.stderr
    payload = gpu_dry_run("tests")
    assert payload["stage"] == "tests" and payload["dry_run"]
    result = payload["result"]
    assert result["passed"] and result["cuda"] == {"device_count": 0, "devices": []}
    assert sorted(result["parts"]) == sorted(tests_stage.PARTS)
    totals = {k: sum(p["counts"][k] for p in result["parts"].values()) for k in result["counts"]}
    assert totals == result["counts"]
    assert result["counts"]["failed"] == result["counts"]["errors"] == 0
    tests = [t for p in result["parts"].values() for t in p["tests"]]
    assert {t["outcome"] for t in tests} == {"passed", "skipped"}
    assert all(set(t) == {"nodeid", "outcome", "seconds", "message"} for t in tests)
    equality = result["parts"]["equality"]["tests"]
    passed = {t["nodeid"] for t in equality if t["outcome"] == "passed"}
    assert any("llama" in n for n in passed) and any("qwen3" in n for n in passed)
    kernels = result["parts"]["kernels"]["tests"]
    # The CUDA-only tests skip on the CPU; a test of the tiny Llama runs without SmolLM2.
    assert any(t["outcome"] == "skipped" and "GPU" in t["message"] for t in kernels)
    assert any(t["outcome"] == "passed" and "greedy" in t["nodeid"] for t in kernels)
