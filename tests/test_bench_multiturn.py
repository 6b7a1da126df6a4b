"""The multi-turn benchmark resends whole histories and reports cache hits per mode."""

from __future__ import annotations

import json

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
