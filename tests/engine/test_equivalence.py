"""Greedy output equals Hugging Face transformers token for token, alone and batched."""

from __future__ import annotations

import pytest
from model_support import hf_greedy, make_random_model

from tokenmill.engine import LLM, SamplingParams

MAX_NEW = 24


def _prompts(tokenizer) -> list[list[int]]:
    """Eight prompts from 1 to 500+ tokens."""
    long_text = " ".join(f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box." for i in range(80))
    texts = [
        "Hello, my name is",
        "The capital of France is",
        "def quicksort(arr):",
        "Write a haiku about the sea.\n",
        "Translate to French: I like to read books in the evening, especially novels.",
        "A list of prime numbers: 2, 3, 5, 7, 11, 13,",
        long_text + " Which box is number 17?",
    ]
    prompts = [tokenizer.encode(t) for t in texts]
    prompts.insert(0, [tokenizer.encode("Once")[0]])
    return prompts


def test_smollm2_greedy_matches_hf_alone_and_batched(smol_llm, smol_hf, smol_tokenizer):
    prompts = _prompts(smol_tokenizer)
    lengths = sorted(len(p) for p in prompts)
    assert lengths[0] == 1 and lengths[-1] > 500
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    expected = [hf_greedy(smol_hf, p, MAX_NEW) for p in prompts]
    batched = smol_llm.generate(prompts, params)
    for want, together in zip(expected, batched, strict=True):
        assert together.outputs[0].token_ids == want
    # Alone, a step holds one sequence: the shortest prompt, a middle one and the longest.
    for i in (0, len(prompts) // 2, len(prompts) - 1):
        assert smol_llm.generate([prompts[i]], params)[0].outputs[0].token_ids == expected[i]


def test_smollm2_chat_answers_paris(smol_llm):
    out = smol_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                        SamplingParams(temperature=0.0, max_tokens=30))[0].outputs[0]
    assert out.text == "The capital of France is Paris."
    assert out.finish_reason == "stop"


def _random_config(kind: str, vocab: int):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=32, **common)
    if kind == "qwen2":
        return transformers.Qwen2Config(**common)
    if kind == "mistral":
        return transformers.MistralConfig(sliding_window=None, **common)
    return transformers.LlamaConfig(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rope_theta=500000.0, **common)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen2", "mistral"])
def test_random_weight_models_match_hf(kind, tmp_path, smol_tokenizer):
    from transformers import AutoModelForCausalLM

    directory = make_random_model(str(tmp_path / kind), _random_config(kind, len(smol_tokenizer)),
                                  smol_tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(directory).eval()
    llm = LLM(directory, show_progress=False, block_size=8, max_num_batched_tokens=256)
    texts = ["a", "The quick brown fox", "one two three four five six seven eight nine ten " * 6]
    prompts = [smol_tokenizer.encode(t) for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    got = llm.generate(prompts, params)
    for prompt, out in zip(prompts, got, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, MAX_NEW)
