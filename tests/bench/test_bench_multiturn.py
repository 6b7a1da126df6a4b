"""The multi-turn benchmark resends whole histories and reports cache hits per mode."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine.bench.multiturn import make_think_times
from tokenmill.engine.cli import build_parser


def test_multiturn_benchmark_on_a_small_workload(tiny_llama_dir, tmp_path):
    out = tmp_path / "multiturn.json"
    args = build_parser().parse_args([
        "bench", "multiturn", "--model", tiny_llama_dir, "--conversations", "3", "--turns", "3",
        "--system-len", "64", "--user-len", "8", "--answer-len", "4", "--json", str(out),
    ])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["cache-off"]["prefix_hit_rate"] == 0.0
    assert summary["cache-on"]["prefix_hit_rate"] > 0.5
    for mode in ("cache-off", "cache-on"):
        records = report["requests"][mode]
        assert len(records) == 9
        for conversation in range(3):
            turns = sorted((r for r in records if r["conversation"] == conversation),
                           key=lambda r: r["turn"])
            # Each turn resends the history: system + every user turn + every answer so far.
            assert [r["prompt_tokens"] for r in turns] == [72, 84, 96]
            assert all(r["output_tokens"] == 4 for r in turns)


def test_think_times_are_seeded_and_arrivals_wait_for_them(tiny_llama_dir, tmp_path):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "multiturn", "--think-time", "-1"])
    args = parser.parse_args(["bench", "multiturn", "--conversations", "40", "--turns", "5",
                              "--think-time", "2"])
    times = make_think_times(args)
    assert times == make_think_times(args)  # the same gaps for the cache-off and cache-on runs
    flat = [t for conv in times for t in conv]
    assert len(flat) == 200 and min(flat) > 0
    assert 1.5 < sum(flat) / len(flat) < 2.5  # exponential with mean 2 s
    no_wait = parser.parse_args(["bench", "multiturn", "--conversations", "2", "--turns", "2"])
    assert make_think_times(no_wait) == [[0.0, 0.0], [0.0, 0.0]]

    out = tmp_path / "multiturn.json"
    args = parser.parse_args([
        "bench", "multiturn", "--model", tiny_llama_dir, "--conversations", "2", "--turns", "2",
        "--system-len", "32", "--user-len", "4", "--answer-len", "2", "--think-time", "0.2",
        "--json", str(out),
    ])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert report["workload"]["think_time"] == 0.2
    # A conversation's turns wait their think times one after another.
    longest_chain = max(sum(conv) for conv in make_think_times(args))
    for mode in ("cache-off", "cache-on"):
        assert len(report["requests"][mode]) == 4
        assert report["summary"][mode]["elapsed_s"] >= longest_chain


def test_offload_mode_compares_the_host_tier_at_the_same_device_pool(tiny_llama_dir, tmp_path):
    """Five conversations against a device pool for about one: with think times between
    turns the others evict a history, which later turns find in the host tier when it is on."""
    out = tmp_path / "multiturn.json"
    block = 16 * 512  # bytes of a 16-token block of the tiny model (2 layers, 2 KV heads of 16)
    args = build_parser().parse_args([
        "bench", "multiturn", "--model", tiny_llama_dir, "--conversations", "5", "--turns", "3",
        "--system-len", "16", "--user-len", "40", "--answer-len", "4", "--think-time", "0.3",
        "--json", str(out),
        "--kv-cache-memory", str(12 * block), "--kv-offloading-size", str(100 * block / 2**30),
    ])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert set(report["requests"]) == {"offload-off", "offload-on"}
    assert summary["offload-off"]["host_hit_rate"] == 0.0
    assert summary["offload-on"]["host_hit_rate"] > 0.2
    for mode in ("offload-off", "offload-on"):
        s = summary[mode]
        assert s["prefix_hit_rate"] == pytest.approx(s["device_hit_rate"] + s["host_hit_rate"])
        assert len(report["requests"][mode]) == 15
    assert summary["offload-on"]["prefix_hit_rate"] > summary["offload-off"]["prefix_hit_rate"]
    assert "later_turn_mean_ttft_speedup" in summary
