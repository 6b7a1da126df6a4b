"""EngineConfig is the single source of CLI flags and operator engine arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenmill.engine.cli import build_parser, engine_config_from_args
from tokenmill.engine.contract.config import ConfigError, EngineConfig, engine_args


def test_every_option_is_a_cli_flag_with_vllm_names():
    args = build_parser().parse_args([
        "generate", "--max-num-seqs", "7", "--max-model-len", "128", "--block-size", "32",
        "--kv-cache-memory", "1000000", "--no-enable-prefix-caching", "--dtype", "float32",
    ])
    config = engine_config_from_args(args)
    assert (config.max_num_seqs, config.max_model_len, config.block_size) == (7, 128, 32)
    assert config.kv_cache_memory == 1_000_000 and config.enable_prefix_caching is False
    defaults = engine_config_from_args(build_parser().parse_args(["generate"]))
    assert defaults == EngineConfig()


def test_vllms_model_flags_parse_and_a_budget_that_cannot_hold_a_prompt_is_refused():
    args = build_parser().parse_args([
        "generate", "--trust-remote-code", "--no-enable-chunked-prefill", "--max-model-len",
        "1024", "--max-num-batched-tokens", "1024"])
    config = engine_config_from_args(args)
    assert config.trust_remote_code is True and config.enable_chunked_prefill is False
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens: \(2048\) must be at least "
                                          r"max_model_len \(4096\) without chunked prefill"):
        EngineConfig(enable_chunked_prefill=False, max_model_len=4096)
    EngineConfig(max_model_len=4096)  # chunks fit any budget


def test_engine_args_round_trip_through_the_cli_parser():
    argv = engine_args(max_num_seqs=12, gpu_memory_utilization=0.8, enable_prefix_caching=True,
                       quantization=None, model="/models/x")
    assert argv == ["--max-num-seqs", "12", "--gpu-memory-utilization", "0.8",
                    "--enable-prefix-caching", "--model", "/models/x"]
    config = engine_config_from_args(build_parser().parse_args(["generate", *argv]))
    assert config.max_num_seqs == 12 and config.gpu_memory_utilization == 0.8
    with pytest.raises(ConfigError, match="not_an_option"):
        engine_args(not_an_option=1)


def test_config_module_does_not_import_torch():
    code = ("import sys, tokenmill.engine.contract.config as c; c.EngineConfig(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0
