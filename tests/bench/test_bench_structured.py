"""`tokenmill bench offline --structured-fraction`: the schema workload, a tiny side-by-side run."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine.bench import offline
from tokenmill.engine.bench.workload import bench_schema, make_workload, with_json_schema
from tokenmill.engine.cli import build_parser
from tokenmill.engine.core.structured import StructuredOutputsParams


def test_the_schema_goes_on_an_even_spread_of_the_requests():
    workload = make_workload(10, (3, 5), (2, 40), seed=1, vocab_size=100)
    half = with_json_schema(workload, 0.5)
    assert [r.json_schema is not None for r in half] == [False, True] * 5
    assert [r.prompt_token_ids for r in half] == [r.prompt_token_ids for r in workload]
    assert sum(r.json_schema is not None for r in with_json_schema(workload, 0.3)) == 3
    schema = half[1].json_schema
    assert schema == bench_schema(max(r.output_len for r in workload))
    assert schema["properties"]["records"]["minItems"] > 40 // 10  # can't close in 40 tokens
    StructuredOutputsParams(json=schema)  # every feature it uses is enforced
    with pytest.raises(ValueError):
        with_json_schema(workload, 1.5)


def test_tiny_side_by_side_run_reports_the_ratio(tmp_path, capsys, tiny_llama_dir):
    pytest.importorskip("xgrammar")
    path = tmp_path / "structured.json"
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "4",
        "--input-len", "4:12", "--output-len", "6:12", "--hf-batch-sizes", "none",
        "--structured-fraction", "0.5", "--json", str(path), "--no-progress",
        "--kv-cache-memory", str(16 << 20), "--bandwidth", "10",
    ])
    assert offline.run(args) == 0
    assert "schema / free" in capsys.readouterr().out
    result = json.loads(path.read_text())["summary"]["structured_outputs"]
    assert result["constrained_requests"] == 2
    assert result["steps"]["free"] == result["steps"]["schema"]
    assert result["ratio_schema_free"] > 0


def test_the_fraction_must_be_in_range():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "offline", "--structured-fraction", "0"])
