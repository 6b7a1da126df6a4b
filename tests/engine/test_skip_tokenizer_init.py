"""--skip-tokenizer-init (vLLM's skip_tokenizer_init): a checkpoint without tokenizer files
serves prompts of token ids, its replies token ids with empty text, equal to transformers'
token for token; the model's config gives its end token; what needs text is refused naming
it."""

from __future__ import annotations

import glob
import os
import shutil

import pytest
from model_support import hf_greedy, hf_reference, make_random_model, update_config_json

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import ModelLoadError, RequestError
from tokenmill.engine.core.structured.params import StructuredOutputsParams

VOCAB = 97
ENGINE = dict(skip_tokenizer_init=True, dtype="float32", max_num_seqs=8,
              max_num_batched_tokens=16, block_size=8, show_progress=False)
PROMPTS = [[5, 6, 7], list(range(10, 31)), [40, 41, 42, 43, 44, 45, 46]]


@pytest.fixture(scope="module")
def untokenized(tmp_path_factory) -> str:
    """A random Llama saved with its tokenizer's files removed."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2)
    directory = make_random_model(str(tmp_path_factory.mktemp("untokenized")), config,
                                  word_level_tokenizer(VOCAB))
    for path in glob.glob(os.path.join(directory, "*token*")):
        os.remove(path)
    return directory


def test_token_ids_in_token_ids_out_equal_transformers(untokenized):
    hf = hf_reference(untokenized)
    want = [hf_greedy(hf, p, 10) for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    with LLM(untokenized, **ENGINE) as llm:
        assert llm.get_tokenizer() is None
        first = llm.generate(PROMPTS, params)
        again = llm.generate(PROMPTS, params)  # from the prefix cache
        cut = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=10,
                                                        ignore_eos=True,
                                                        truncate_prompt_tokens=4))[0]
    for out, expected in zip(first + again, want + want, strict=True):
        c = out.outputs[0]
        assert c.token_ids == expected and c.text == ""
        assert all(t in entry for t, entry in zip(c.token_ids, c.logprobs, strict=True))
    assert again[1].num_cached_tokens == 16
    assert cut.prompt_token_ids == PROMPTS[1][-4:]
    assert cut.outputs[0].token_ids == hf_greedy(hf, PROMPTS[1][-4:], 10)


def test_ngram_speculation_needs_no_tokenizer(untokenized):
    hf = hf_reference(untokenized)
    prompt = [7, 8, 9, 10] * 5
    speculative = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    with LLM(untokenized, speculative_config=speculative, **ENGINE) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12,
                                                    ignore_eos=True))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 12)


def test_the_configs_end_token_ends_a_reply(untokenized, tmp_path):
    """The end token comes from config.json alone: made the first greedy token, it ends the
    reply at once."""
    hf = hf_reference(untokenized)
    first = hf_greedy(hf, PROMPTS[0], 1)[0]
    directory = shutil.copytree(untokenized, tmp_path / "model")
    update_config_json(str(directory), eos_token_id=first)
    os.remove(directory / "generation_config.json")
    with LLM(str(directory), **ENGINE) as llm:
        c = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=10))[0]
    assert c.outputs[0].token_ids == [first] and c.outputs[0].finish_reason == "stop"


def test_what_needs_text_is_refused_naming_it(untokenized):
    with pytest.raises(ModelLoadError, match="--skip-tokenizer-init"):
        LLM(untokenized, show_progress=False)
    draft = '{"model": "' + untokenized + '", "num_speculative_tokens": 2}'
    with pytest.raises(ConfigError, match="skip_tokenizer_init: a draft model"):
        LLM(untokenized, speculative_config=draft, **ENGINE)
    fields = {"stop": SamplingParams(stop=["x"]), "bad_words": SamplingParams(bad_words=["x"]),
              "structured_outputs": SamplingParams(
                  structured_outputs=StructuredOutputsParams(regex="a+"))}
    with LLM(untokenized, **ENGINE) as llm:
        with pytest.raises(RequestError, match="text prompt needs the tokenizer"):
            llm.generate(["hello"], SamplingParams(max_tokens=2))
        for field, params in fields.items():
            with pytest.raises(RequestError, match=f"{field} needs the tokenizer") as refused:
                llm.generate([PROMPTS[0]], params)
            assert refused.value.param == field
        with pytest.raises(RequestError, match="a chat needs the tokenizer"):
            llm.chat([{"role": "user", "content": "hi"}])
        assert llm.generate([PROMPTS[0]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids
