"""Models that slide their attention over a window (Mistral 7B v0.1, Qwen2 with
use_sliding_window): each sliding layer attends over its window, so output past it equals the
model's and the context runs to the model's length."""

from __future__ import annotations

import pytest
import torch
import transformers
from model_support import hf_greedy, make_random_model

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.models.architecture import sliding_window_of

WINDOW = 40
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def test_which_configs_slide():
    assert sliding_window_of(transformers.MistralConfig()) == 4096
    assert sliding_window_of(transformers.MistralConfig(sliding_window=None)) is None
    assert sliding_window_of(transformers.LlamaConfig()) is None
    assert sliding_window_of(transformers.Qwen2Config(sliding_window=64)) is None
    assert sliding_window_of(transformers.Qwen2Config(use_sliding_window=True, sliding_window=64,
                                                      num_hidden_layers=4,
                                                      max_window_layers=2)) == 64
    assert sliding_window_of(transformers.Qwen3Config(sliding_window=64)) is None
    assert sliding_window_of(transformers.Qwen3Config(use_sliding_window=True,
                                                      sliding_window=64)) == 64


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory, smol_tokenizer):
    config = transformers.MistralConfig(vocab_size=len(smol_tokenizer), sliding_window=WINDOW,
                                        **COMMON)
    return make_random_model(str(tmp_path_factory.mktemp("mistral-sw")), config, smol_tokenizer)


def test_the_window_changes_the_models_output_past_it(mistral_dir):
    """Why the window must be honoured: past it, the model's own attention (HF's, with the
    window) gives other logits than attention over the whole context."""
    windowed = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir).eval()
    full = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir,
                                                            sliding_window=None).eval()
    ids = torch.arange(3, 3 + 2 * WINDOW).unsqueeze(0)
    with torch.no_grad():
        a, b = windowed(ids).logits[0], full(ids).logits[0]
    assert torch.allclose(a[:WINDOW], b[:WINDOW], atol=1e-5)
    assert not torch.allclose(a[WINDOW:], b[WINDOW:], atol=1e-3)


def test_past_the_window_the_output_equals_the_models_own(mistral_dir, smol_tokenizer):
    """Every layer attends over its last WINDOW positions, in prefill chunks and in decodes,
    so generation runs to the model's whole context and stays the model's."""
    with LLM(mistral_dir, show_progress=False, block_size=8, max_num_seqs=4,
             max_num_batched_tokens=32) as llm:
        assert llm.engine.max_model_len == 512
        reference = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir).eval()
        prompts = [smol_tokenizer.encode("one two three four five six seven eight nine ten "
                                         * n) for n in (1, 9)]
        assert len(prompts[1]) > 2 * WINDOW
        params = SamplingParams(temperature=0.0, max_tokens=2 * WINDOW, ignore_eos=True)
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outs == [hf_greedy(reference, p, 2 * WINDOW) for p in prompts]


def test_disable_sliding_window_makes_the_window_the_context_length(mistral_dir, smol_tokenizer,
                                                                    tiny_llama_dir):
    """vLLM's --disable-sliding-window: the window becomes the context, where full attention
    is the model's; a longer --max-model-len is refused naming the flag, and a model without
    a window keeps its length."""
    with pytest.raises(ConfigError, match=r"max_model_len: 64 exceeds the model's sliding "
                                          r"window, which --disable-sliding-window makes the "
                                          r"context length \(40\)"):
        LLM(mistral_dir, show_progress=False, disable_sliding_window=True, max_model_len=64)
    with LLM(mistral_dir, show_progress=False, disable_sliding_window=True,
             block_size=8) as llm:
        assert llm.engine.max_model_len == WINDOW
        prompt = smol_tokenizer.encode("one two three four five six seven")
        params = SamplingParams(temperature=0.0, max_tokens=WINDOW - len(prompt),
                                ignore_eos=True)
        out = llm.generate([prompt], params)[0].outputs[0].token_ids
        reference = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir).eval()
        assert out == hf_greedy(reference, prompt, WINDOW - len(prompt))
        with pytest.raises(RequestError, match="maximum context length is 40 tokens"):
            llm.generate([prompt], SamplingParams(max_tokens=WINDOW))
    with LLM(tiny_llama_dir, show_progress=False, disable_sliding_window=True) as llm:
        assert llm.engine.max_model_len == 1024
