"""LLM.generate and LLM.chat given no SamplingParams sample as the model's
generation_config.json recommends (vLLM's get_default_sampling_params), and LLM.get_tokenizer
is the model's tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest

from tokenmill.engine import LLM, SamplingParams

PROMPTS = [[1, 450, 7314, 310, 3444], [1, 9038, 2501, 263]]


@pytest.fixture(scope="module")
def recommending(tmp_path_factory, tiny_llama_dir):
    """The tiny model with a generation config that recommends top_k 1 (so a sampled reply
    is the greedy one) and 5 new tokens."""
    directory = tmp_path_factory.mktemp("recommending") / "model"
    shutil.copytree(tiny_llama_dir, directory)
    config = json.loads((directory / "generation_config.json").read_text())
    config.update(top_k=1, temperature=0.7, max_new_tokens=5)
    (directory / "generation_config.json").write_text(json.dumps(config))
    llm = LLM(str(directory), show_progress=False)
    yield llm
    llm.shutdown()


def test_no_params_sample_as_the_model_recommends(recommending, tiny_llama):
    defaults = recommending.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature, defaults.max_tokens) == (1, 0.7, 5)
    assert (defaults.top_p, defaults.min_p, defaults.repetition_penalty) == (1.0, 0.0, 1.0)
    greedy = tiny_llama.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=5,
                                                         ignore_eos=True))
    for out, want in zip(recommending.generate(PROMPTS), greedy, strict=True):
        assert out.outputs[0].token_ids == want.outputs[0].token_ids[:len(out.outputs[0].token_ids)]
        assert len(out.outputs[0].token_ids) == 5 or out.outputs[0].finish_reason == "stop"
    # Given params win whole: vLLM's defaults apply only where none are given.
    given = recommending.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=2))
    assert len(given[0].outputs[0].token_ids) <= 2


def test_a_model_that_recommends_nothing_gets_the_api_defaults(tiny_llama):
    assert tiny_llama.get_default_sampling_params() == SamplingParams()
    assert tiny_llama.get_tokenizer() is tiny_llama.tokenizer
