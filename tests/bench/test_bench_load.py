"""`tokenmill bench load`: raw reads and the engine's loads of the same files, side by side,
and the load from s3:// on moto's server; the raw JSON holds every run and the ratios.
No timing is asserted beyond being positive: speed claims live in docs/benchmarks.md."""

from __future__ import annotations

import json
import os

from tokenmill.engine.cli import main


def test_raw_reads_and_loads_of_the_same_files_in_one_run(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "load.json"
    assert main(["bench", "load", "--model", tiny_llama_dir, "--workers", "1,2",
                 "--repeats", "1", "--s3", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    size = os.path.getsize(os.path.join(tiny_llama_dir, "model.safetensors"))
    assert payload["file_bytes"] == size and payload["files"] == 1
    kinds = {(r["mode"], r["kind"]) for r in payload["runs"]}
    assert kinds == {(m, k) for m in ("cold", "warm")
                     for k in ("raw", "raw-fresh", "load-1", "load-2")}
    for run in payload["runs"]:
        assert run["gb_per_s"] > 0
        if run["kind"].startswith("load"):
            # The tensors' bytes: the file less its header.
            assert size - 100_000 < run["bytes"] < size
            assert isinstance(run["peak_rss_added_bytes"], int)
        else:
            assert run["bytes"] == size
    cold = payload["summary"]["cold"]
    assert cold["load_2"]["ratio_to_raw"] == cold["load_2"]["gb_per_s"] / cold["raw_gb_per_s"]
    [s3] = payload["s3"]
    assert s3["download_seconds"] > 0 and s3["load_bytes"] == payload["runs"][-1]["bytes"]
    assert payload["summary"]["s3"]["total_seconds"] > s3["download_seconds"]
    assert "of raw" in capsys.readouterr().out
