"""vLLM's offline SamplingParams options: detokenize=False (token ids alone), truncate_prompt_tokens
(the prompt's last tokens run), guided_decoding (structured_outputs' older name) and
spaces_between_special_tokens."""

from __future__ import annotations

import pytest

from tokenmill.engine import SamplingParams
from tokenmill.engine.core import StructuredOutputsParams
from tokenmill.engine.core.errors import SamplingParamsError

PROMPT = [1, 450, 7314, 310, 3444, 263, 1243, 338, 2107, 29871]


def test_detokenize_false_gives_the_same_tokens_without_text(tiny_llama):
    greedy = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": True, "logprobs": 1}
    plain, bare = tiny_llama.generate([PROMPT, PROMPT], [
        SamplingParams(**greedy), SamplingParams(**greedy, detokenize=False)])
    assert bare.outputs[0].token_ids == plain.outputs[0].token_ids
    assert bare.outputs[0].logprobs == plain.outputs[0].logprobs
    assert plain.outputs[0].text and bare.outputs[0].text == ""
    with pytest.raises(SamplingParamsError, match="stop: stop strings .* detokenize=True"):
        SamplingParams(stop=["."], detokenize=False)


def test_truncate_prompt_tokens_runs_the_prompts_last_tokens(tiny_llama):
    greedy = {"temperature": 0.0, "max_tokens": 4, "ignore_eos": True}
    cut, whole_tail = tiny_llama.generate([PROMPT, PROMPT[-4:]], [
        SamplingParams(**greedy, truncate_prompt_tokens=4), SamplingParams(**greedy)])
    assert cut.prompt_token_ids == PROMPT[-4:]
    assert cut.outputs[0].token_ids == whole_tail.outputs[0].token_ids
    context = tiny_llama.generate([PROMPT], SamplingParams(**greedy, truncate_prompt_tokens=-1))
    assert context[0].prompt_token_ids == PROMPT  # -1: the context length, which it fits
    for bad in (0, -2):
        with pytest.raises(SamplingParamsError, match="truncate_prompt_tokens: must be -1"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_guided_decoding_is_structured_outputs_older_name(tiny_llama):
    params = SamplingParams(guided_decoding={"choice": ["yes", "no"]}, max_tokens=5)
    assert params.structured_outputs == StructuredOutputsParams(choice=["yes", "no"])
    assert tiny_llama.generate([PROMPT], params)[0].outputs[0].text in ("yes", "no")
    with pytest.raises(SamplingParamsError, match="guided_decoding: give structured_outputs"):
        SamplingParams(guided_decoding={"choice": ["a"]},
                       structured_outputs={"choice": ["b"]})


def test_spaces_between_special_tokens_is_taken_either_way():
    assert not SamplingParams(spaces_between_special_tokens=False).spaces_between_special_tokens
