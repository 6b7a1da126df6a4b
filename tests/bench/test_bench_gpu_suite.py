"""`tokenmill bench gpu`: the GPU acceptance suite's bench stage and summary, run dry on the CPU
(a tiny random Llama, cut-down workloads): every part writes its JSON in the shape a GPU run
writes, and the summary reads them back beside the issue's targets."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from tokenmill.engine.bench.gpu_suite import bench_stage
from tokenmill.engine.cli import main


@pytest.fixture(scope="module")
def bench_dir(gpu_dry_run):
    gpu_dry_run("bench")
    return gpu_dry_run


def _result(dry_run, name: str) -> dict:
    payload = dry_run.read(name)
    assert payload["suite"] == "gpu-acceptance" and payload["dry_run"] is True
    assert payload["machine"]["device"] == "cpu" and "commit" in payload["git"]
    return payload["result"]


def test_every_part_writes_each_modes_throughput_and_decode_bound(bench_dir):
    for part, (workload, modes, with_hf) in bench_stage.PARTS.items():
        result = _result(bench_dir, f"bench-{part}")
        spec = bench_stage.DRY[workload]
        assert result["workload"]["num_prompts"] == spec.num_prompts
        assert list(result["modes"]) == list(modes)
        first = next(iter(result["modes"].values()))
        assert first["throughput_ratio"] == 1.0
        for run in result["modes"].values():
            assert run["output_tokens_per_s"] > 0 and run["num_preemptions"] >= 0
            assert run["decode_steps"] > 0
            bound = run["decode_bound"]["all"]
            assert bound["decode_steps"] == run["decode_steps"] and bound["ratio_median"] > 0
            assert not run["graphs_captured"]  # CPU: eager whatever the mode asks
            split = run["time_split"]
            assert split["other_steps"] == run["num_steps"] - run["decode_steps"] > 0
            assert split["decode_steps_s"] + split["other_steps_s"] + \
                split["between_steps_s"] == pytest.approx(run["elapsed_s"])
            assert split["decode_steps_s"] > 0 and split["between_steps_s"] >= 0
            spread = split["decode_step_ms"]
            assert 0 < spread["p50"] <= spread["p90"] <= spread["p99"] <= spread["max"]
        assert ("hf" in result) is with_hf
    options = _result(bench_dir, "bench-batch1-fp8")["modes"]
    assert options["fp8"]["options"]["quantization"] == "fp8"
    assert options["kv-fp8"]["options"]["kv_cache_dtype"] == "fp8"
    assert options["kv-fp8"]["memory"]["kv_bytes_per_token"] < \
        options["bf16"]["memory"]["kv_bytes_per_token"]
    ngram = _result(bench_dir, "bench-batch1-ngram")["modes"]
    assert ngram["plain"]["speculation"]["draft_tokens"] == 0
    assert ngram["ngram"]["options"]["speculative_config"] is not None
    assert ngram["ngram"]["speculation"]["draft_tokens"] >= \
        ngram["ngram"]["speculation"]["accepted_tokens"] >= 0
    hf = _result(bench_dir, "bench-hf")
    assert hf["hf"]["batch_size"] == bench_stage.HF_BATCH[True]
    assert hf["hf"]["output_tokens"] == hf["workload"]["output_tokens"]
    assert set(hf["ratio_vs_hf"]) == {"eager", "cuda-graphs", "graphs-async"}
    budgets = _result(bench_dir, "bench-throughput-budget")["modes"]
    assert [m["options"]["max_num_batched_tokens"] for m in budgets.values()] == [2048, 8192]
    overlapped = _result(bench_dir, "bench-throughput")["modes"]["graphs-async"]
    assert overlapped["options"]["async_scheduling"] is True
    assert overlapped["output_tokens_per_s"] > 0


def test_the_kv_offload_part_finds_prefixes_in_the_host_tier_and_times_copies(bench_dir):
    result = _result(bench_dir, "bench-kv-offload")
    summary = result["multiturn"]["summary"]
    assert summary["offload-off"]["host_hit_rate"] == 0.0
    assert summary["offload-on"]["host_hit_rate"] > 0.0
    copies = result["copies"]
    assert copies["bytes"] == copies["blocks"] * copies["block_bytes"]
    assert all(copies[k] > 0 for k in ("tier_to_host_gb_per_s", "tier_to_device_gb_per_s",
                                       "plain_to_host_gb_per_s", "plain_to_device_gb_per_s"))


def test_the_lora_part_runs_base_idle_and_mixed_adapters_in_lockstep(bench_dir):
    result = _result(bench_dir, "bench-lora")
    assert result["adapters"] == bench_stage.LORA_ADAPTERS
    assert result["workload"]["num_prompts"] == bench_stage.DRY["hf"].num_prompts
    assert len(set(result["steps"].values())) == 1
    assert result["adapter_slot_loads"]["lora-mix"] == bench_stage.LORA_ADAPTERS


def test_the_summary_sets_every_part_against_its_target(bench_dir, tmp_path, capsys):
    """The summary of the bench, profile and startup stages' files in one directory (as a
    session writes them), the tests stage not run."""
    for stage in ("bench", "profile", "startup"):
        bench_dir(stage)
        for path in bench_dir.directory(stage).glob("gpu-dry-run-*.json"):
            shutil.copy(path, tmp_path)
    capsys.readouterr()
    assert main(["bench", "gpu", "summary", "--dry-run", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    for part in bench_stage.PARTS:
        assert f"| {part}, " in table
    assert "| batch1, cuda-graphs / eager |" in table and ">= 3x: " in table
    assert "| throughput, cuda-graphs: output tok/s |" in table and ">= 10,000: " in table
    assert "| throughput, graphs-async: output tok/s |" in table
    assert "kv-offload: later-turn TTFT" in table
    assert "| lora: 4 adapters mixed / base model, output tok/s |" in table
    assert "(tokenmill: eager " in table
    assert "| profile, graphs, batch 1: decode step |" in table
    assert "| profile, eager, batch 8: decode step |" in table
    assert "top engine function engine/" in table
    assert "| profile, prefill, prefill step of 64 tokens |" in table
    assert re.search(r"\| throughput, eager: output tok/s \| [^|]* s in decode steps, "
                     r"[^|]* s in \d+ other steps, [^|]* s between steps \|", table)
    assert "| startup, cold (KV 16 MiB) |" in table
    assert "Not run: tests" in table


def test_only_runs_the_parts_named_and_refuses_unknown_ones(tmp_path):
    with pytest.raises(SystemExit, match=r"unknown parts \['nope'\]"):
        main(["bench", "gpu", "bench", "--dry-run", "--out", str(tmp_path), "--only", "nope"])
    with pytest.raises(SystemExit, match="parts: throughput, hf, batch1"):
        main(["bench", "gpu", "bench", "--dry-run", "--out", str(tmp_path), "--only", "help"])


def test_modes_keeps_the_named_modes_in_the_parts_order_and_refuses_none_known():
    modes = bench_stage.PARTS["throughput"][1]
    assert bench_stage.chosen_modes("throughput", modes, None) is modes
    kept = bench_stage.chosen_modes("throughput", modes, "graphs-async, cuda-graphs,eager-nope")
    assert list(kept) == ["cuda-graphs", "graphs-async"]
    assert kept["graphs-async"] == modes["graphs-async"]
    with pytest.raises(SystemExit, match=r"part batch1-fp8 has none of \['eager'\]; its modes "
                                         r"are \['bf16', 'fp8', 'kv-fp8'\]"):
        bench_stage.chosen_modes("batch1-fp8", bench_stage.PARTS["batch1-fp8"][1], "eager")


def test_modes_are_checked_against_every_chosen_part_before_anything_runs(tmp_path):
    """--modes without --only would reach the fp8 parts, which have no graphs modes: refused
    at once, before a model is made or a part runs, as is a mode no chosen part has."""
    def bench(*options: str) -> None:
        main(["bench", "gpu", "bench", "--dry-run", "--out", str(tmp_path), *options])

    with pytest.raises(SystemExit, match=r"part throughput-fp8 has none of \['cuda-graphs'\]"):
        bench("--modes", "cuda-graphs")
    with pytest.raises(SystemExit, match=r"no part chosen has \['grpahs-async'\]"):
        bench("--only", "throughput,batch1", "--modes", "cuda-graphs,grpahs-async")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is")
def test_a_real_run_without_a_gpu_says_so_and_points_at_dry_run(tmp_path):
    with pytest.raises(SystemExit, match="no CUDA device here; --dry-run"):
        main(["bench", "gpu", "bench", "--out", str(tmp_path)])


BROKEN_MODES = {"eager": {"enforce_eager": True},
                "no-kv-pool": {"kv_cache_memory": 1},  # no block fits: the engine refuses
                "cuda-graphs": {"enforce_eager": False}}


def test_a_mode_that_fails_is_recorded_and_the_modes_after_it_still_run(tmp_path, monkeypatch,
                                                                        capsys):
    """On a lent GPU a mode that crashes must not cost the part's other modes: its error is
    recorded, the next mode runs, the stage exits 1, and the summary names the failure."""
    import json

    from tokenmill.engine.bench.gpu_suite import summary

    monkeypatch.setitem(bench_stage.PARTS, "batch1", ("one", BROKEN_MODES, False))
    code = main(["bench", "gpu", "bench", "--dry-run", "--out", str(tmp_path), "--model-dir",
                 str(tmp_path / "model"), "--only", "batch1", "--no-progress"])
    assert code == 1
    result = json.loads((tmp_path / "gpu-dry-run-bench-batch1.json").read_text())["result"]
    assert list(result["modes"]) == ["eager", "cuda-graphs"] and not result["pending_modes"]
    assert list(result["failed_modes"]) == ["no-kv-pool"]
    assert "KV" in result["failed_modes"]["no-kv-pool"]
    assert result["modes"]["cuda-graphs"]["throughput_ratio"] > 0
    assert "Traceback" in capsys.readouterr().err  # the whole error, for the one fixing it
    table = summary.format_table({"bench-batch1": {"result": result}})
    assert "| batch1, no-kv-pool | failed: " in table
    assert "| batch1, cuda-graphs / eager |" in table


def test_each_mode_is_written_as_it_finishes_and_a_failed_first_mode_leaves_no_ratios(
        tmp_path, monkeypatch):
    from tokenmill.engine.bench.bandwidth import measure_bandwidth
    from tokenmill.engine.bench.gpu_suite import summary
    from tokenmill.engine.bench.gpu_suite.context import SuiteContext

    modes = {"no-kv-pool": BROKEN_MODES["no-kv-pool"], "eager": BROKEN_MODES["eager"]}
    monkeypatch.setitem(bench_stage.PARTS, "batch1", ("one", modes, False))
    ctx = SuiteContext(stage="bench", out_dir=tmp_path, prefix="gpu-dry-run", dry_run=True,
                       model_dir=tmp_path / "model", show_progress=False)
    written: list[tuple[list[str], list[str], list[str]]] = []
    result = bench_stage.run_part(
        ctx, ctx.model(), "batch1", measure_bandwidth("cpu"),
        write=lambda r: written.append((list(r["modes"]), list(r["failed_modes"]),
                                        list(r["pending_modes"]))))
    assert written == [([], ["no-kv-pool"], ["eager"]), (["eager"], ["no-kv-pool"], [])]
    assert "throughput_ratio" not in result["modes"]["eager"]
    table = summary.format_table({"bench-batch1": {"result": result}})
    assert "| batch1, eager: output tok/s |" in table and "/ no-kv-pool" not in table
    partial = dict(result, modes={}, pending_modes=["eager"],
                   failed_modes={"no-kv-pool": "RuntimeError: CUDA error: | one\ntwo"})
    table = summary.format_table({"bench-batch1": {"result": partial}})
    assert "| batch1, eager | not run (the part stopped before it) |" in table
    assert "| batch1, no-kv-pool | failed: RuntimeError: CUDA error: / one | runs: missed |" \
        in table  # one line of the error, no column break
