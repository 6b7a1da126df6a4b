"""Models that slide their attention over a window (Mistral 7B v0.1, Qwen2 with
use_sliding_window): the engine attends to the whole context, which equals the model's
attention only on sequences no longer than the window, so the context stops there."""

from __future__ import annotations

import pytest
import torch
import transformers
from model_support import hf_greedy, make_random_model

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
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
    """Why the context stops at the window: past it, the model's own attention (HF's, with
    the window) gives other logits than attention over the whole context."""
    windowed = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir).eval()
    full = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir,
                                                            sliding_window=None).eval()
    ids = torch.arange(3, 3 + 2 * WINDOW).unsqueeze(0)
    with torch.no_grad():
        a, b = windowed(ids).logits[0], full(ids).logits[0]
    assert torch.allclose(a[:WINDOW], b[:WINDOW], atol=1e-5)
    assert not torch.allclose(a[WINDOW:], b[WINDOW:], atol=1e-3)


def test_the_context_stops_at_the_window_and_matches_the_model_there(mistral_dir,
                                                                     smol_tokenizer):
    llm = LLM(mistral_dir, show_progress=False, block_size=8)
    try:
        assert llm.engine.max_model_len == WINDOW
        reference = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir).eval()
        prompt = smol_tokenizer.encode("one two three four five six seven eight nine ten")
        room = WINDOW - len(prompt)
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=room,
                                                    ignore_eos=True))[0].outputs[0]
        assert len(out.token_ids) == room
        assert out.token_ids == hf_greedy(reference, prompt, room)[:len(out.token_ids)]
        with pytest.raises(ValueError, match="maximum context length"):
            llm.generate([prompt], SamplingParams(max_tokens=room + 1))
    finally:
        llm.shutdown()


def test_a_longer_max_model_len_is_refused_naming_the_window(mistral_dir):
    with pytest.raises(ConfigError, match=f"max_model_len.*sliding attention window "
                                          f"\\({WINDOW} tokens\\)"):
        LLM(mistral_dir, show_progress=False, max_model_len=WINDOW + 1)
    llm = LLM(mistral_dir, show_progress=False, max_model_len=WINDOW - 8)
    try:
        assert llm.engine.max_model_len == WINDOW - 8
    finally:
        llm.shutdown()
