"""`tokenmill bench host-overhead`: a tiny many-layer model, timed and op-counted per step."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine.bench import host_overhead
from tokenmill.engine.cli import build_parser

TINY = ["--batch-sizes", "1,2", "--steps", "3", "--warmup-steps", "1", "--prompt-len", "5"]


def _run(tmp_path, num_layers: int) -> dict:
    path = tmp_path / f"host-{num_layers}.json"
    args = build_parser().parse_args(["bench", "host-overhead", "--num-layers", str(num_layers),
                                      "--json", str(path), *TINY])
    assert args.func(args) == 0
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host-overhead")
    return {n: _run(tmp, n) for n in (2, 4)}


def test_json_reports_every_batch_size_with_a_consistent_split(runs):
    data = runs[4]
    assert data["benchmark"] == "host-overhead" and data["num_layers"] == 4
    assert data["git"]["commit"] and data["machine"]["torch_threads"] == 1
    assert [r["batch_size"] for r in data["results"]] == [1, 2]
    for r in data["results"]:
        assert len(r["samples_us"]["step_s"]) == r["steps"] == 3
        assert r["step_us"] > 0
        assert 0 < r["forward_us"] <= r["execute_us"] < r["step_us"]
        assert 0 < r["outside_forward_us"] < r["step_us"]
        assert r["outside_execute_us"] == pytest.approx(r["step_us"] - r["execute_us"])
        assert r["step_us_per_layer"] == pytest.approx(r["step_us"] / 4)
        assert r["ops_per_step"] == pytest.approx(sum(r["op_counts_per_step"].values()))
        assert 0 < r["ops_in_layers_per_step"] < r["ops_per_step"]


def test_ops_per_step_grow_with_layers_at_a_constant_cost_per_layer(runs):
    for small, large in zip(runs[2]["results"], runs[4]["results"], strict=True):
        assert large["ops_per_step"] > small["ops_per_step"]
        assert large["ops_per_layer"] == pytest.approx(small["ops_per_layer"], rel=0.1)
        # Every layer after the first dispatches the same ops (the first may also build
        # metadata that later layers reuse), and the two extra layers are the whole difference.
        later = large["ops_by_layer_per_step"][1:]
        assert later == [small["ops_by_layer_per_step"][1]] * 3
        assert large["ops_per_step"] - small["ops_per_step"] == pytest.approx(2 * later[0])
        assert later[0] > 10  # norms, projections, rope, attention, MLP


def test_table_names_each_batch_size(runs, capsys):
    print(host_overhead.format_table(runs[2]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 layers")
    assert [line.split()[0] for line in lines[2:]] == ["1", "2"]


def test_cli_defaults_are_the_issue_shape():
    args = build_parser().parse_args(["bench", "host-overhead"])
    assert (args.num_layers, args.batch_sizes, args.model) == (32, [1, 16], None)
    assert args.threads == 1


def test_prompts_beyond_one_steps_token_budget_are_fed_before_the_timed_decode_steps(tmp_path):
    path = tmp_path / "budget.json"
    args = build_parser().parse_args([
        "bench", "host-overhead", "--num-layers", "1", "--batch-sizes", "4", "--steps", "3",
        "--warmup-steps", "1", "--prompt-len", "6", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "8", "--json", str(path)])
    assert args.func(args) == 0
    (result,) = json.loads(path.read_text())["results"]
    assert result["prefill_steps"] >= 3  # 24 prompt tokens, 8 a step
    assert len(result["samples_us"]["step_s"]) == 3


def test_each_output_kind_runs_and_is_named(tmp_path, capsys):
    for kind in host_overhead.OUTPUT_KINDS:
        path = tmp_path / f"{kind}.json"
        args = build_parser().parse_args(["bench", "host-overhead", "--num-layers", "1",
                                          "--output-kind", kind, "--json", str(path), *TINY])
        assert args.func(args) == 0
        assert json.loads(path.read_text())["args"]["output_kind"] == kind
        assert f"{kind} outputs" in capsys.readouterr().out


def test_requests_sample_with_the_options_given(tmp_path, monkeypatch):
    """--temperature, --top-p, --top-k and --min-p reach every request; a value the engine
    refuses stops the run before the model is built, naming the option."""
    from tokenmill.engine.core import engine as engine_module

    seen = []
    original = engine_module.LLMEngine.add_request

    def record(self, request_id, prompt, params=None, *args, **kwargs):
        seen.append(params)
        return original(self, request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine_module.LLMEngine, "add_request", record)
    args = build_parser().parse_args([
        "bench", "host-overhead", "--num-layers", "1", "--temperature", "0.7", "--top-p", "0.9",
        "--top-k", "20", "--min-p", "0.05", *TINY])
    assert args.func(args) == 0
    assert seen and {(p.temperature, p.top_p, p.top_k, p.min_p) for p in seen} == {
        (0.7, 0.9, 20, 0.05)}
    bad = build_parser().parse_args(["bench", "host-overhead", "--top-p", "0", *TINY])
    assert bad.func(bad) == 2
