"""The LoRA options: vLLM's flag names and entry forms, checked before anything loads."""

from __future__ import annotations

import argparse

import pytest

from tokenmill.engine.contract.config import (
    ConfigError,
    EngineConfig,
    add_engine_arguments,
    engine_args,
    engine_config_from_args,
)
from tokenmill.engine.contract.lora import LoRAModule, LoRAModuleError


def _parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return engine_config_from_args(parser.parse_args(list(argv)))


def test_flags_take_several_modules_in_both_forms():
    config = _parse("--enable-lora", "--lora-modules", "sql=/a/sql",
                    '{"name": "chat", "path": "hf://org/chat-lora"}', "--max-loras", "2",
                    "--max-lora-rank", "64")
    assert config.lora_adapters() == [LoRAModule("sql", "/a/sql"),
                                      LoRAModule("chat", "hf://org/chat-lora")]
    assert (config.max_loras, config.max_lora_rank, config.cpu_lora_capacity) == (2, 64, 2)
    assert not config.allow_runtime_lora_updating


def test_engine_args_round_trip_a_list_option():
    args = engine_args(enable_lora=True, lora_modules=("a=/x", "b=/y"), max_cpu_loras=4)
    assert args == ["--enable-lora", "--lora-modules", "a=/x", "b=/y", "--max-cpu-loras", "4"]
    config = _parse(*args)
    assert config.lora_modules == ("a=/x", "b=/y") and config.cpu_lora_capacity == 4
    assert engine_args(lora_modules=()) == []


@pytest.mark.parametrize(("options", "option", "words"), [
    ({"lora_modules": ["a=/x"]}, "lora_modules", "needs enable_lora"),
    ({"allow_runtime_lora_updating": True}, "allow_runtime_lora_updating", "needs enable_lora"),
    ({"enable_lora": True, "lora_modules": ["a"]}, "lora_modules", "is not NAME=PATH"),
    ({"enable_lora": True, "lora_modules": ["a=/x", "a=/y"]}, "lora_modules", "given twice"),
    ({"enable_lora": True, "lora_modules": ["bad name=/x"]}, "lora_modules", "letters, digits"),
    ({"enable_lora": True, "lora_modules": ['{"name": "a"}']}, "lora_modules", "a name and a path"),
    ({"enable_lora": True, "max_loras": 0}, "max_loras", "at least 1"),
    ({"enable_lora": True, "max_lora_rank": 1024}, "max_lora_rank", "1..512"),
    ({"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras", "at least"),
])
def test_bad_options_name_themselves(options, option, words):
    with pytest.raises(ConfigError, match=words) as caught:
        EngineConfig(**options)
    assert caught.value.option == option


def test_names_follow_request_and_label_rules():
    assert LoRAModule.parse("a.b_c-1=/p").name == "a.b_c-1"
    for bad in ("-a=/p", "a-=/p", "=/p", f"{'x' * 64}=/p"):
        with pytest.raises(LoRAModuleError):
            LoRAModule.parse(bad)
