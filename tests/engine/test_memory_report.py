"""What quantization saves, as the engine reports it (start-up log, /metrics, benchmarks), and
`tokenmill bench offline --compare-quantization`."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine.bench import offline
from tokenmill.engine.cli import build_parser
from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.core.engine import LLMEngine

BUDGET = 8 << 20  # bytes of KV pool, the same for every mode


def _report(model_dir: str, **options) -> dict:
    config = EngineConfig(model=model_dir, kv_cache_memory=BUDGET, max_num_seqs=16, **options)
    return LLMEngine(config, show_progress=False).memory_report()


def test_quantization_shrinks_weights_and_grows_the_kv_pool(tiny_llama_dir):
    base = _report(tiny_llama_dir)
    both = _report(tiny_llama_dir, quantization="int8", kv_cache_dtype="int8")
    assert (base["quantization"], base["kv_cache_dtype"]) == ("none", "float32")
    assert (both["quantization"], both["kv_cache_dtype"]) == ("int8", "int8")
    assert both["weights_bytes"] < base["weights_bytes"]
    # float32 K/V of head_dim 16 take 64 bytes per head and token; int8 takes 16 plus a
    # 4-byte scale: 3.2x the tokens in the same bytes.
    assert base["kv_bytes_per_token"] / both["kv_bytes_per_token"] == pytest.approx(3.2)
    assert both["kv_tokens_per_gib"] / base["kv_tokens_per_gib"] == pytest.approx(3.2)
    ratio = both["kv_capacity_tokens"] / base["kv_capacity_tokens"]
    assert ratio == pytest.approx(3.2, rel=0.01)  # whole blocks


def test_bench_offline_compares_modes_at_one_kv_budget(tmp_path, capsys, tiny_llama_dir):
    path = tmp_path / "quant.json"
    args = build_parser().parse_args([
        "bench", "offline", "--model", tiny_llama_dir, "--num-prompts", "12",
        "--input-len", "40:80", "--output-len", "8:16", "--hf-batch-sizes", "none",
        "--kv-cache-memory", str(256 << 10), "--max-num-seqs", "16", "--no-progress",
        "--compare-quantization", "int8,kv-int8", "--json", str(path)])
    assert offline.run(args) == 0
    out = capsys.readouterr().out
    assert "kv-int8" in out and "KV ratio" in out
    modes = json.loads(path.read_text())["summary"]["quantization"]["modes"]
    assert list(modes) == ["unquantized", "int8", "kv-int8"]
    assert modes["int8"]["weights_ratio"] < 1 and modes["int8"]["kv_capacity_ratio"] == 1
    assert modes["kv-int8"]["kv_capacity_ratio"] == pytest.approx(3.2, rel=0.02)
    # The small pool limits the unquantized run; the larger int8 pool runs more at once.
    assert modes["kv-int8"]["max_running_seqs"] > modes["unquantized"]["max_running_seqs"]
    assert all(m["output_tokens_per_s"] > 0 for m in modes.values())


def test_unknown_modes_are_refused_by_the_parser():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "offline", "--compare-quantization", "int4"])
