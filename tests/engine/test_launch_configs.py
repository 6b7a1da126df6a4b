"""Kernel launch settings measured per GPU model: a file's entry for the shape at hand, else its
"*" entry, else the kernel's defaults; the caller's overrides last. The file is the packaged one
for the device's name, or the one TOKENMILL_KERNEL_CONFIGS names."""

from __future__ import annotations

import json

import pytest
import torch

from tokenmill.engine.kernels import launch_configs

CPU = torch.device("cpu")
DEFAULTS = {"block_n": 16, "num_warps": 4}


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    """Two kernels of these tests' own, whose defaults are DEFAULTS."""
    for name in ("k", "absent"):
        monkeypatch.setitem(launch_configs.KERNEL_DEFAULTS, name, DEFAULTS)
    yield
    launch_configs.clear_cache()


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    def write(table):
        path = tmp_path / f"configs-{len(list(tmp_path.iterdir()))}.json"
        path.write_text(table if isinstance(table, str) else json.dumps(table))
        monkeypatch.setenv(launch_configs.ENV_VAR, str(path))
        return path

    yield write
    launch_configs.clear_cache()


def test_without_a_file_the_defaults_stand(monkeypatch, tmp_path):
    monkeypatch.setenv(launch_configs.ENV_VAR, str(tmp_path / "missing.json"))
    assert launch_configs.launch_config("k", "any", CPU) == DEFAULTS
    assert launch_configs.source(CPU) is None
    monkeypatch.delenv(launch_configs.ENV_VAR)
    # No file is packaged for a CPU: what the kernels run on there never changes.
    assert launch_configs.source(CPU) is None
    assert launch_configs.launch_config("weight_only_matmul", "4096x4096:m1", CPU) == \
        launch_configs.KERNEL_DEFAULTS["weight_only_matmul"]


def test_the_shapes_entry_then_the_kernels_star_entry(config_file):
    path = config_file({"k": {"64x64:m1": {"block_n": 32}, "*": {"num_warps": 8}},
                        "other": {"64x64:m1": {"block_n": 128}}})
    assert launch_configs.source(CPU) == str(path)
    assert launch_configs.launch_config("k", "64x64:m1", CPU) == {
        "block_n": 32, "num_warps": 4}
    assert launch_configs.launch_config("k", "128x64:m1", CPU) == {
        "block_n": 16, "num_warps": 8}
    assert launch_configs.launch_config("absent", "64x64:m1", CPU) == DEFAULTS


def test_settings_a_kernel_does_not_have_are_left_out_and_overrides_come_last(config_file):
    config_file({"k": {"s": {"block_n": 64, "retired_setting": 3}}})
    assert launch_configs.launch_config("k", "s", CPU) == {
        "block_n": 64, "num_warps": 4}
    assert launch_configs.launch_config("k", "s", CPU, {"block_n": 8}) == {
        "block_n": 8, "num_warps": 4}
    with pytest.raises(TypeError, match="k has no launch setting blok_n"):
        launch_configs.launch_config("k", "s", CPU, {"blok_n": 8})


@pytest.mark.parametrize("text", ["{not json", '["a list"]', '{"k": {"s": 3}}'])
def test_a_malformed_file_is_refused_naming_it(config_file, text):
    path = config_file(text)
    with pytest.raises(ValueError, match=f"kernel launch configs {path}"):
        launch_configs.launch_config("k", "s", CPU)


def test_file_names_follow_the_device_name():
    assert launch_configs.slug("NVIDIA H200") == "nvidia-h200"
    assert launch_configs.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert launch_configs.device_slug(CPU) == "cpu"
