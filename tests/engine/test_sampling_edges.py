"""Requests at the edges of what sampling takes: each is refused when it is added (naming its
option) or served with tokens its masks allow; none may raise inside a step, where it would end
the server's engine loop for every request, or draw a token its masks forbid."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.core.sampling_params import SamplingParamsError


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8)


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 30000) for _ in range(8)]


def _tokens(llm: LLM, params: SamplingParams, seed: int = 0) -> list[int]:
    return llm.generate([_prompt(seed)], params)[0].outputs[0].token_ids


@pytest.mark.parametrize("top_k", [10**309, 2**70, 10**6])
def test_a_top_k_past_the_vocabulary_keeps_every_token(llm, top_k):
    """A top_k no float holds (JSON integers have no bound) raised inside the step."""
    params = SamplingParams(temperature=1.0, top_k=top_k, max_tokens=4, seed=1,
                            ignore_eos=True)
    unbounded = SamplingParams(temperature=1.0, max_tokens=4, seed=1, ignore_eos=True)
    assert _tokens(llm, params) == _tokens(llm, unbounded)


@pytest.mark.parametrize("options", [
    {"temperature": 1e-40}, {"temperature": 5e-324},
    {"temperature": 1.0, "repetition_penalty": 1e-40},
    {"temperature": 1e-30, "logit_bias": {5: 100.0}},
])
def test_logits_past_float32_still_draw_an_allowed_token(llm, options):
    """Dividing by a tiny temperature or penalty made an infinite logit, the softmax NaN and
    the draw token 0, whatever allowed_token_ids said."""
    params = SamplingParams(max_tokens=6, seed=2, ignore_eos=True, allowed_token_ids=[5, 6],
                            **options)
    assert set(_tokens(llm, params)) <= {5, 6}
    assert SamplingParams(temperature=1e-40).temperature == 0.01  # vLLM's floor


def test_allowed_tokens_all_banned_are_refused_naming_allowed_token_ids(llm):
    eos = next(iter(llm.engine.eos_token_ids))
    word = llm.engine.tokenizer.decode([5])
    refused = [SamplingParams(allowed_token_ids=[eos], min_tokens=3),
               SamplingParams(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=2),
               SamplingParams(allowed_token_ids=[5], bad_words=[word])]
    if llm.engine._bad_word_ids([word]) != [[5]]:
        refused.pop()  # the tokenizer spells the word otherwise: not a one-token ban
    for params in refused:
        with pytest.raises(RequestError, match="every token it allows is banned") as info:
            llm.generate([_prompt(3)], params)
        assert info.value.param == "allowed_token_ids"
    served = SamplingParams(allowed_token_ids=[eos, 9], min_tokens=3, max_tokens=4,
                            temperature=0.0)
    assert _tokens(llm, served, seed=3)[:3] == [9, 9, 9]


def test_a_grammar_that_can_only_end_ends_despite_min_tokens(llm):
    """min_tokens masks EOS; a choice already complete allows nothing else. The grammar wins
    (the reply ends short of min_tokens) where the row had no token left to draw."""
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=10,
                            structured_outputs={"choice": ["yes"]})
    out = llm.generate([_prompt(4)], params)[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.text == "yes" and len(out.token_ids) < 10


@pytest.mark.parametrize("options", [
    {"n": 2.0}, {"max_tokens": 2.5}, {"min_tokens": True}, {"top_k": 3.0},
    {"logprobs": True}, {"logprobs": 2.5}, {"prompt_logprobs": 1.5}, {"seed": 1.5},
    {"seed": "1"}, {"temperature": "1"}, {"top_p": None}, {"stop": [5]},
    {"allowed_token_ids": {5, 6}}, {"allowed_token_ids": [True]}, {"bad_words": "word"},
])
def test_options_of_the_wrong_type_are_refused_naming_them(options):
    """The server's request models refuse these; the offline API took them and failed inside
    a step."""
    name = next(iter(options))
    with pytest.raises(SamplingParamsError, match=f"^{name}: "):
        SamplingParams(**options)


@pytest.mark.parametrize("key", ["05", "+5", " 5", "5 ", "٥", "1_0", "-0"])
def test_logit_bias_keys_are_plain_integers(key):
    with pytest.raises(SamplingParamsError, match="logit_bias: token id"):
        SamplingParams(logit_bias={key: 1.0})
    with pytest.raises(SamplingParamsError, match="token id 5 is given twice"):
        SamplingParams(logit_bias={"5": 100.0, 5: -100.0})
    assert SamplingParams(logit_bias={"5": 1.0, 6: -1.0}).logit_bias == {5: 1.0, 6: -1.0}


def test_a_checkpoints_ids_past_its_vocabulary_never_reach_the_logits(tiny_llama_dir,
                                                                      tmp_path):
    """An EOS id, a bad word's tokens and a text prompt's tokens past the model's vocabulary
    (a tokenizer larger than the embeddings): left out, or the request refused when added."""
    directory = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, directory)
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    (directory / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [2, vocab + 5]}))
    llm = LLM(str(directory), show_progress=False, max_num_seqs=4)
    assert llm.engine.eos_token_ids == {2}
    params = SamplingParams(temperature=0.0, max_tokens=4, min_tokens=2, ignore_eos=False)
    assert len(_tokens(llm, params)) >= 2
    tokenizer = llm.engine.tokenizer
    llm.engine.model_config.vocab_size = vocab - 50  # as if the embeddings were smaller
    past = tokenizer.decode([vocab - 10])
    assert llm.engine._bad_word_ids([past]) == [] or all(
        max(word) < vocab - 50 for word in llm.engine._bad_word_ids([past]))
    with pytest.raises(RequestError, match="tokens the model has no embedding for"):
        llm.generate([f"Hi {past}"], SamplingParams(max_tokens=2))
