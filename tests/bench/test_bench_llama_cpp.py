"""`tokenmill bench llama-cpp`: tokenmill's side always runs; llama.cpp's where it is installed,
each request emitting exactly --output-len tokens on both sides."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tokenmill.engine.cli import main


def _run(tmp_path, *flags):
    out = tmp_path / "r.json"
    assert main(["bench", "llama-cpp", "--streams", "1,3", "--output-len", "5",
                 "--max-model-len", "256", "--kv-cache-memory", str(16 << 20), "--no-progress",
                 "--json", str(out), *flags]) == 0
    return json.loads(out.read_text())


def test_without_llama_cpp_its_side_is_skipped_and_said_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    result = _run(tmp_path)
    assert "llama_cpp is not installed" in capsys.readouterr().err
    assert [c["streams"] for c in result["cells"]] == [1, 3]
    for cell in result["cells"]:
        ours = cell["tokenmill"]
        assert ours["tokens_per_request"] == [5] * cell["streams"]
        assert ours["output_tokens_per_s"] > 0 and cell["llama_cpp"] is None
    assert result["engine"]["quantization"] == "gguf" and result["llama_cpp_version"] is None
    assert result["banned_tokens"]  # the file's special tokens


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (pip install llama-cpp-python)")
def test_llama_cpp_runs_the_same_requests_to_the_same_length(tmp_path):
    result = _run(tmp_path, "--threads", "1")
    for cell in result["cells"]:
        theirs = cell["llama_cpp"]
        assert theirs["tokens_per_request"] == [5] * cell["streams"]
        assert cell["ratio"] == pytest.approx(cell["tokenmill"]["output_tokens_per_s"]
                                              / theirs["output_tokens_per_s"])


def test_a_model_that_is_not_gguf_is_refused_in_one_line(tiny_llama_dir, capsys):
    assert main(["bench", "llama-cpp", "--model", tiny_llama_dir, "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == ("tokenmill bench llama-cpp: --model must be a "
                                               "GGUF file (llama.cpp reads only GGUF)")
