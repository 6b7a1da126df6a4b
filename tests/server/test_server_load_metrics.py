"""/metrics says what loading the model took: download seconds (0 for a local directory),
load seconds, the checkpoint bytes read and their rate, set once at start-up."""

from __future__ import annotations

import os

import pytest
from safetensors import safe_open
from server_support import load_metrics


def _checkpoint_bytes(directory: str) -> int:
    total = 0
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    t = f.get_slice(key)
                    numel = 1
                    for d in t.get_shape():
                        numel *= d
                    total += numel * {"F32": 4, "BF16": 2, "F16": 2}[t.get_dtype()]
    return total


def test_load_seconds_bytes_and_rate_of_a_local_model(tiny_server, tiny_llama_dir):
    m = load_metrics(tiny_server.url)
    assert m["tokenmill_model_download_seconds"] == 0
    assert 0 < m["tokenmill_model_load_seconds"] < 600
    assert m["tokenmill_model_load_bytes"] == _checkpoint_bytes(tiny_llama_dir)
    assert m["tokenmill_model_load_bytes_per_second"] == pytest.approx(
        m["tokenmill_model_load_bytes"] / m["tokenmill_model_load_seconds"], rel=1e-3)
    # Set once: a second scrape reads the same values.
    assert load_metrics(tiny_server.url) == m
