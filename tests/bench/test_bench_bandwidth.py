"""Decode step vs. bandwidth bound in `tokenmill bench offline`: the arithmetic, the copy
measurement, and a tiny real run whose bound comes from the bytes the engine holds.
No timing is asserted beyond being positive: speed claims live in docs/benchmarks.md."""

from __future__ import annotations

import argparse
import json

import pytest
from safetensors import safe_open

from tokenmill.engine.bench import decode_bound, offline
from tokenmill.engine.bench.bandwidth import given_bandwidth, measure_bandwidth
from tokenmill.engine.bench.decode_bound import DecodeStep, batch_band, step_bytes
from tokenmill.engine.cli import build_parser


def test_bound_is_weights_plus_attended_kv_over_bandwidth():
    assert step_bytes(1_000_000_000, 1_000, 300) == 1_000_300_000
    bw = given_bandwidth(100.0)  # GB/s, decimal
    assert bw.seconds_for(1_000_300_000) == pytest.approx(0.010003)
    steps = [DecodeStep(0.020, 1, 100), DecodeStep(0.030, 2, 200), DecodeStep(0.050, 2, 400)]
    summary = decode_bound.summarize(steps, 1_000_000_000, 1_000, bw)
    one, two = summary["bands"]["1"], summary["bands"]["2"]
    assert one["decode_steps"] == 1 and one["bytes_median"] == 1_000_100_000
    assert one["bound_s_median"] == pytest.approx(0.010001)
    assert one["ratio_median"] == pytest.approx(0.020 / 0.010001)
    assert two["decode_steps"] == 2 and two["context_tokens_median"] == 300
    assert two["step_s_median"] == pytest.approx(0.040)
    assert two["bound_s_median"] == pytest.approx(0.010003)
    # The ratio is the median of per-step ratios, not a ratio of medians.
    assert two["ratio_median"] == pytest.approx((0.030 / 0.010002 + 0.050 / 0.010004) / 2)
    assert summary["all"]["decode_steps"] == 3 and summary["all"]["batch_max"] == 2
    assert summary["bandwidth"]["source"] == "given"
    assert "step/bound" in decode_bound.format_summary(summary)


def test_batch_bands_are_powers_of_two():
    assert [batch_band(b) for b in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [
        "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "33-64", "65-128"]


def test_no_decode_steps_still_formats():
    summary = decode_bound.summarize([], 10, 1, given_bandwidth(1.0))
    assert summary["bands"] == {} and summary["all"] == {"decode_steps": 0}
    assert decode_bound.format_summary(summary).splitlines()[-1].split()[:2] == ["all", "0"]


def test_copy_bandwidth_counts_bytes_read_and_written():
    bw = measure_bandwidth("cpu", copy_bytes=4 << 20, repeats=3)
    assert bw.source == "measured" and bw.device == "cpu"
    assert bw.copy_bytes == 4 << 20 and bw.repeats == 3
    assert bw.gb_per_s >= bw.median_gb_per_s > 0


def test_bandwidth_flag_parses_gb_per_s():
    args = build_parser().parse_args(["bench", "offline", "--bandwidth", "3000"])
    assert args.bandwidth == 3000.0
    assert build_parser().parse_args(["bench", "offline"]).bandwidth is None
    for bad in ("0", "-1", "fast"):
        with pytest.raises(argparse.ArgumentTypeError):
            offline._bandwidth(bad)


def _step_read_bytes(directory: str) -> int:
    """The checkpoint's bytes but its input embedding table (untied here: a step reads only
    its rows)."""
    with safe_open(f"{directory}/model.safetensors", "pt") as f:
        return sum(f.get_tensor(name).nbytes for name in f.keys()  # noqa: SIM118
                   if name != "model.embed_tokens.weight")


def test_one_request_decodes_with_its_context_growing_by_one(tiny_llama_dir, tmp_path, capsys):
    """One request of 10 prompt tokens and 5 outputs: a prefill step makes the first token,
    then 4 decode steps attend to 11..14 tokens. The bound uses the float32 weights a step
    reads (the checkpoint's bytes but the untied embedding table) and K and V of 2 layers x 2
    KV heads x 16 dims x 4 bytes."""
    path = tmp_path / "one.json"
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "1", "--input-len",
        "10", "--output-len", "5", "--hf-batch-sizes", "none", "--bandwidth", "2.5",
        "--json", str(path), "--no-progress",
    ])
    assert offline.run(args) == 0
    assert "decode step vs. bandwidth bound: 2.5 GB/s (given)" in capsys.readouterr().out
    data = json.loads(path.read_text())
    steps = data["kv_steps"]
    assert [s["decode_batch"] for s in steps] == [0, 1, 1, 1, 1]
    assert [s["context_tokens"] for s in steps] == [10, 11, 12, 13, 14]

    bound = data["summary"]["decode_bound"]
    weights = _step_read_bytes(tiny_llama_dir)
    kv_per_token = 2 * 2 * 2 * 16 * 4
    assert (bound["weights_bytes"], bound["kv_bytes_per_token"]) == (weights, kv_per_token)
    assert bound["bandwidth"] == {"gb_per_s": 2.5, "source": "given", "device": None,
                                  "median_gb_per_s": None, "copy_bytes": None, "repeats": 0}
    band = bound["bands"]["1"]
    assert band["decode_steps"] == 4 and band["batch_median"] == 1
    assert band["step_s_median"] > 0
    assert band["bytes_median"] == weights + 12.5 * kv_per_token
    assert band["bound_s_median"] == pytest.approx((weights + 12.5 * kv_per_token) / 2.5e9)
    assert band["ratio_median"] > 0
    assert bound["all"] == band


def test_batched_run_measures_bandwidth_and_bands_by_batch(tiny_llama_dir, capsys):
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "6", "--input-len",
        "4:20", "--output-len", "3:12", "--hf-batch-sizes", "none", "--no-progress",
    ])
    summary, payload = offline.benchmark(args)
    bound = summary["decode_bound"]
    assert bound["bandwidth"]["source"] == "measured"
    assert bound["bandwidth"]["device"] == "cpu" and bound["bandwidth"]["gb_per_s"] > 0
    decodes = [s for s in payload["kv_steps"] if s["decode_batch"]]
    assert bound["all"]["decode_steps"] == len(decodes) > 0
    assert sum(b["decode_steps"] for b in bound["bands"].values()) == len(decodes)
    assert bound["all"]["batch_max"] == max(s["decode_batch"] for s in decodes) > 1
    for name, band in bound["bands"].items():
        assert batch_band(band["batch_min"]) == batch_band(band["batch_max"]) == name
        assert band["step_s_median"] > 0 and band["bound_s_median"] > 0
