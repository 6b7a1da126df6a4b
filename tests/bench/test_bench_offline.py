"""`tokenmill bench offline`: the seeded workload, and tiny end-to-end runs of the command and its
comparisons."""

from __future__ import annotations

import argparse
import json

import pytest

from tokenmill.engine.bench import offline
from tokenmill.engine.bench.workload import make_workload, parse_range
from tokenmill.engine.cli import build_parser


def test_workload_is_seeded_within_ranges_and_free_of_special_tokens():
    special = set(range(10))
    a = make_workload(200, (3, 9), (2, 5), seed=7, vocab_size=100, special_token_ids=special)
    b = make_workload(200, (3, 9), (2, 5), seed=7, vocab_size=100, special_token_ids=special)
    c = make_workload(200, (3, 9), (2, 5), seed=8, vocab_size=100, special_token_ids=special)
    assert a == b
    assert a != c
    assert {r.input_len for r in a} == set(range(3, 10))  # inclusive at both ends
    assert {r.output_len for r in a} == set(range(2, 6))
    tokens = {t for r in a for t in r.prompt_token_ids}
    assert tokens <= set(range(10, 100)) and len(tokens) > 50


def test_the_engine_run_reports_each_request_once_finished(tiny_llama):
    """As LLM.generate: no output per step (a benchmark reads none), the whole at the end."""
    from tokenmill.engine.bench import engine_run

    workload = make_workload(4, (8, 16), (3, 6), seed=0,
                             vocab_size=tiny_llama.engine.model_config.vocab_size)
    run = engine_run.run_engine(tiny_llama, workload, show_progress=False)
    assert [r["output_len"] for r in run.requests] == [w.output_len for w in workload]
    engine = tiny_llama.engine
    engine.add_request("one", workload[0].prompt_token_ids, engine_run.params_for(workload[0]))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert len(outputs) == 1 and outputs[0].finished


def test_length_ranges_and_batch_sizes_parse():
    assert parse_range("32:512") == (32, 512)
    assert parse_range("7") == (7, 7)
    for bad in ("0:4", "9:3", "a:b", ""):
        with pytest.raises(ValueError):
            parse_range(bad)
    assert offline.parse_batch_sizes("8,32") == [8, 32]
    assert offline.parse_batch_sizes("none") == offline.parse_batch_sizes("") == []
    with pytest.raises(argparse.ArgumentTypeError):
        offline.parse_batch_sizes("8,0")


def test_cli_defaults_are_the_issue_workload():
    args = build_parser().parse_args(["bench", "offline"])
    assert (args.num_prompts, args.input_len, args.output_len) == (64, (32, 512), (16, 256))
    assert args.hf_batch_sizes == [8, 32]
    assert args.workload_seed == 0 and args.seed == 0  # workload seed apart from engine seed


def test_tiny_run_against_hf_writes_auditable_json(tmp_path, capsys, smol_tokenizer,
                                                   tiny_llama_dir):
    """The whole command on the tiny Llama (SmolLM2's tokenizer): engine run, HF baseline,
    decode bound, table and JSON."""
    path = tmp_path / "offline.json"
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "3", "--input-len",
        "4:12", "--output-len", "2:6",
        "--hf-batch-sizes", "2", "--workload-seed", "3", "--json", str(path), "--no-progress",
        "--kv-cache-memory", str(64 << 20),
    ])
    assert offline.run(args) == 0
    assert "ratio vs HF best" in capsys.readouterr().out

    data = json.loads(path.read_text())
    expected = make_workload(3, (4, 12), (2, 6), 3, len(smol_tokenizer),
                             offline.special_ids(smol_tokenizer))
    requests = data["requests"]
    assert [r["input_len"] for r in requests] == [r.input_len for r in expected]
    assert [r["output_len"] for r in requests] == [r.output_len for r in expected]
    assert all(0 < r["ttft_s"] <= r["e2e_s"] for r in requests)
    summary = data["summary"]
    assert summary["ratio"] > 0
    assert summary["hf_best_batch_size"] == 2
    assert summary["hf"]["2"]["output_tokens"] == sum(r.output_len for r in expected)
    assert summary["tokenmill"]["num_preemptions"] == 0
    assert 0.0 <= summary["tokenmill"]["kv_cache"]["waste_mean"] < 1.0
    assert data["machine"]["torch_version"] and data["git"]["commit"]
    assert data["engine_config"]["kv_cache_memory"] == 64 << 20


def test_prefix_cache_ab_steps_both_engines_alike_and_finds_no_reuse(tiny_llama_dir, tmp_path,
                                                                      capsys):
    path = tmp_path / "ab.json"
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "4", "--input-len",
        "20:40", "--output-len", "2:5", "--hf-batch-sizes", "none", "--prefix-cache-ab",
        "--json", str(path), "--no-progress",
    ])
    assert offline.run(args) == 0
    assert "cache on / off" in capsys.readouterr().out
    data = json.loads(path.read_text())
    ab = data["summary"]["prefix_cache_ab"]
    # Deterministic engines given the same requests take the same steps, so steps pair up.
    assert ab["steps"]["cache-on"] == ab["steps"]["cache-off"] == data["summary"]["tokenmill"][
        "num_steps"]
    assert ab["output_tokens"] == sum(r["output_len"] for r in data["requests"])
    # Random prompts share no block, so the cache finds nothing to reuse.
    assert ab["prefix_hit_tokens"] == {"cache-on": 0, "cache-off": 0}
    rates = ab["output_tokens_per_s"]
    assert ab["ratio_on_off"] == pytest.approx(rates["cache-on"] / rates["cache-off"])


def test_tensor_parallel_comparison_counts_every_collective(tiny_llama_dir, capsys):
    """TP=2 on the 2-layer model: per step two all-reduces per layer, one for the embedding
    and one gather of the logits; TP=1 makes none. Both runs finish the same workload."""
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "4", "--input-len",
        "4:40", "--output-len", "3:6", "--hf-batch-sizes", "none", "--no-progress",
        "--max-num-batched-tokens", "32", "--max-num-seqs", "4", "--block-size", "8",
        "--compare-tensor-parallel", "1,2",
    ])
    assert args.compare_tensor_parallel == [1, 2]
    summary, _ = offline.benchmark(args)
    one, two = summary["tensor_parallel"]["sizes"]
    assert (one["tensor_parallel_size"], two["tensor_parallel_size"]) == (1, 2)
    assert one["collectives_per_step"] == 0 and one["collective_ms_per_step"] == 0
    assert two["collectives_per_step"] == 2 * 2 + 1 + 1
    assert two["collective_ms_per_step"] > 0
    assert one["throughput_ratio"] == 1.0 and two["throughput_ratio"] > 0
    assert two["weights_bytes_rank0"] < one["weights_bytes_rank0"]
    from tokenmill.engine.bench.tp_ab import format_comparison

    assert format_comparison(summary["tensor_parallel"]).splitlines()[2].split()[0] == "2"
    with pytest.raises(argparse.ArgumentTypeError):
        offline._tp_sizes("1,0")


def _tiny_comparison(model: str, flag: str) -> dict:
    """The summary of `bench offline` over three tiny requests with one comparison flag."""
    args = build_parser().parse_args([
        "bench", "offline", "--model", model, "--num-prompts", "3", "--input-len", "4:20",
        "--output-len", "3:5", "--hf-batch-sizes", "none", "--no-progress", flag,
    ])
    summary, _ = offline.benchmark(args)
    return summary


def test_cuda_graphs_comparison_runs_eager_then_graphs(tiny_llama_dir):
    """On CPU no graph is captured: both runs are eager, and the report says so."""
    summary = _tiny_comparison(tiny_llama_dir, "--compare-cuda-graphs")
    eager, graphed = summary["cuda_graphs"]["runs"]
    assert eager["enforce_eager"] and not graphed["enforce_eager"]
    assert not graphed["graphs_captured"] and graphed["graph_replays"] == 0
    assert eager["decode_steps"] > 0 and eager["decode_step_ms_p50"] > 0
    assert eager["throughput_ratio"] == 1.0 and graphed["throughput_ratio"] > 0
    from tokenmill.engine.bench.graphs_ab import format_comparison

    assert "no graphs here" in format_comparison(summary["cuda_graphs"])


def test_async_scheduling_comparison_runs_without_then_with_it(tiny_llama_dir):
    summary = _tiny_comparison(tiny_llama_dir, "--compare-async-scheduling")
    plain, overlapped = summary["async_scheduling"]["runs"]
    assert not plain["async_scheduling"] and overlapped["async_scheduling"]
    assert plain["elapsed_s"] > 0 and overlapped["elapsed_s"] > 0
    assert plain["decode_steps"] > 0 and overlapped["decode_step_ms_p50"] > 0
    assert plain["throughput_ratio"] == 1.0 and overlapped["throughput_ratio"] > 0
    from tokenmill.engine.bench.async_ab import format_comparison

    table = format_comparison(summary["async_scheduling"])
    assert "async scheduling" in table and "nothing overlaps" in table


def test_preemption_comparison_resumes_from_the_cache_and_the_host_tier(tiny_llama_dir):
    """A pool of 8 blocks for 6 sequences growing to ~80 tokens: every mode preempts; without
    the prefix cache all preempted work is redone; with the host tier most comes back by copy."""
    import torch
    from transformers import AutoConfig

    from tokenmill.engine.bench.preempt_ab import format_comparison
    from tokenmill.engine.execution.kv_layout import KVCacheLayout

    block = KVCacheLayout.for_model(AutoConfig.from_pretrained(tiny_llama_dir), 16,
                                    torch.float32).bytes_per_block
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "6", "--input-len",
        "30:40", "--output-len", "40", "--hf-batch-sizes", "none", "--no-progress",
        "--max-num-batched-tokens", "32", "--max-num-seqs", "4",
        "--kv-cache-memory", str(8 * block), "--compare-preemption",
    ])
    summary, _ = offline.benchmark(args)
    modes = summary["preemption"]["modes"]
    assert list(modes) == ["recompute", "prefix-cache", "host-tier"]
    assert all(m["num_preemptions"] > 0 for m in modes.values())
    recompute, tier = modes["recompute"]["resumed_tokens"], modes["host-tier"]["resumed_tokens"]
    assert recompute["device"] == recompute["host"] == 0 and recompute["recomputed"] > 0
    assert tier["host"] > 0 and tier["recomputed"] < recompute["recomputed"]
    assert modes["host-tier"]["kv_offloading_size_gib"] == pytest.approx(
        4 * 8 * block / (1 << 30))
    assert modes["recompute"]["throughput_ratio"] == 1.0
    assert format_comparison(summary["preemption"]).splitlines()[3].split()[0] == "host-tier"


def test_lora_comparison_runs_base_idle_and_mixed_adapters_side_by_side(tiny_llama_dir):
    """Three engines in lockstep take the same steps (no request waits for an adapter slot);
    the mixed mode really runs its requests on the adapters."""
    from tokenmill.engine.bench import lora_ab

    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "6", "--input-len",
        "8:16", "--output-len", "6:10", "--hf-batch-sizes", "none", "--no-progress",
        "--compare-lora", "3",
    ])
    summary, _ = offline.benchmark(args)
    result = summary["lora"]
    assert result["adapters"] == 3 and result["rank"] == lora_ab.DEFAULT_RANK
    assert list(result["output_tokens_per_s"]) == list(lora_ab.MODES)
    assert len(set(result["steps"].values())) == 1  # paired step for step
    assert result["ratio_to_base"]["base"] == 1.0
    assert all(r > 0 for r in result["ratio_to_base"].values())
    assert result["adapter_slot_loads"] == {"base": 0, "lora-idle": 0, "lora-mix": 3}
    lines = lora_ab.format_comparison(result).splitlines()
    assert len(lines) == 3 and "3 adapters (rank 16) mixed" in lines[2]


def test_every_comparison_in_the_table_has_its_flag_and_module():
    """Each entry names a flag of `bench offline` (off by default) and a module whose compare
    takes the flag's value under the entry's keyword."""
    import inspect

    args = build_parser().parse_args(["bench", "offline"])
    for dest, comparison in offline.COMPARISONS.items():
        assert not getattr(args, dest)
        module = comparison.load()
        parameters = inspect.signature(module.compare).parameters
        assert "show_progress" in parameters and callable(module.format_comparison)
        assert comparison.keyword is None or comparison.keyword in parameters
