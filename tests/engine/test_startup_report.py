"""The engine's start-up report: seconds of each phase, taken where the work is done, and the
whole; the same figures in the start-up log."""

from __future__ import annotations

import logging
import time

from tokenmill.engine import LLM
from tokenmill.engine.execution import rank
from tokenmill.engine.execution.runner import ModelRunner

PHASES = ("config_seconds", "tokenizer_seconds", "weights_seconds", "kv_profile_seconds",
          "kv_allocate_seconds", "graph_capture_seconds")


def _engine(model_dir: str):
    return LLM(model_dir, show_progress=False, max_model_len=64, kv_cache_memory=4 << 20).engine


def test_every_phase_is_timed_and_the_phases_fit_in_the_total(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    report = engine.startup_report()
    assert list(report) == [*PHASES, "total_seconds"]
    assert all(report[p] >= 0 for p in PHASES)
    assert report["tokenizer_seconds"] > 0 and report["weights_seconds"] > 0
    assert report["graph_capture_seconds"] == 0  # no CUDA graphs on the CPU
    assert sum(report[p] for p in PHASES) <= report["total_seconds"]
    # Loading the weights is one part of the weights phase (which also allocates the model).
    assert report["weights_seconds"] >= engine.load_report()["load_seconds"]


def test_graph_capture_is_its_own_phase(tiny_llama_dir, monkeypatch):
    def capture(self, *args, **kwargs):
        time.sleep(0.05)

    monkeypatch.setattr(rank, "graphs_wanted", lambda *args: True)
    monkeypatch.setattr(ModelRunner, "capture_decode_graphs", capture)
    report = _engine(tiny_llama_dir).startup_report()
    assert 0.05 <= report["graph_capture_seconds"] < report["total_seconds"]
    assert sum(report[p] for p in PHASES) <= report["total_seconds"]


def test_start_up_logs_its_phases(tiny_llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="tokenmill.engine.core.engine"):
        engine = _engine(tiny_llama_dir)
    [record] = [r for r in caplog.records if r.getMessage() == "engine ready"]
    report = engine.startup_report()
    for name in (*PHASES, "total_seconds"):
        assert getattr(record, name) == round(report[name], 3)


def test_memory_report_gives_the_kv_pool_bytes(tiny_llama_dir):
    memory = _engine(tiny_llama_dir).memory_report()
    assert memory["kv_pool_bytes"] == memory["kv_capacity_tokens"] * memory["kv_bytes_per_token"]
    assert 0 <= (4 << 20) - memory["kv_pool_bytes"] < 16 * memory["kv_bytes_per_token"]
