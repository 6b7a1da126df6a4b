"""--speculative-config: vLLM's JSON shape, checked at construction with errors that name the
option and the key."""

from __future__ import annotations

import pytest

from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.contract.speculative import SpeculativeConfig


def test_ngram_and_draft_shapes_parse_with_vllm_keys():
    ngram = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, '
                                    '"prompt_lookup_max": 5, "prompt_lookup_min": 2}')
    assert (ngram.method, ngram.num_speculative_tokens, ngram.prompt_lookup_max,
            ngram.prompt_lookup_min) == ("ngram", 3, 5, 2)
    draft = SpeculativeConfig.parse({"model": "/models/draft", "num_speculative_tokens": 4})
    assert (draft.method, draft.model) == ("draft", "/models/draft")
    off = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2,
                                   "disable_by_batch_size": 8})
    assert off.disable_by_batch_size == 8
    assert EngineConfig().speculative() is None


def test_without_a_cut_off_the_device_types_measured_default_applies():
    from tokenmill.engine.contract.speculative import DEFAULT_DISABLE_BY_BATCH_SIZE

    plain = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2})
    assert plain.disable_by_batch_size is None
    assert plain.on_device("cpu").disable_by_batch_size == DEFAULT_DISABLE_BY_BATCH_SIZE["cpu"]
    assert plain.on_device("cuda").disable_by_batch_size == 0  # not measured: never off
    given = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2,
                                     "disable_by_batch_size": 32})
    assert given.on_device("cpu") is given


def test_disable_by_batch_size_zero_never_turns_speculation_off():
    never = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2,
                                     "disable_by_batch_size": 0})
    assert never.disable_by_batch_size == 0


@pytest.mark.parametrize("text, message", [
    ("not json", "is not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"method": "medusa", "num_speculative_tokens": 2}', "method 'medusa' is not one of"),
    ('{"method": "ngram"}', "'num_speculative_tokens' is required"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', r"must be in 1\.\.16, got 0"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', r"must be in 1\.\.16, got 17"),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', "must be an integer"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, '
     '"prompt_lookup_min": 3}', r"'prompt_lookup_min' must be in 1\.\.2"),
    ('{"method": "draft", "num_speculative_tokens": 2}', 'needs "model"'),
    ('{"method": "ngram", "model": "x", "num_speculative_tokens": 2}', 'takes no "model"'),
    ('{"method": "ngram", "num_speculative_tokens": 2, "k": 1}', r"unknown keys \['k'\]"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": -1}',
     r"'disable_by_batch_size' must be in >= 0 \(0: never\), got -1"),
])
def test_bad_configs_fail_naming_the_option_and_the_key(text, message):
    with pytest.raises(ConfigError, match=f"^speculative_config: .*{message}"):
        EngineConfig(speculative_config=text)
