"""Granite (`GraniteForCausalLM`, IBM's Granite 3.x): Llama's layers with four multipliers
read from the config (embeddings, attention scale, each branch's output as it joins the
residual stream, and a divisor of the logits). Greedy output equals transformers token for
token (batched, chunked, from the prefix cache, under tensor parallelism), and its
log-probabilities are transformers' (the logits divisor changes them, not the greedy
choice)."""

from __future__ import annotations

import pytest
import torch
from model_support import greedy_three_ways, hf_greedy, make_random_model, mixed_prompts

from tokenmill.engine import LLM, SamplingParams

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def granite_dir(tmp_path_factory, vocab_tokenizer) -> str:
    import transformers

    # Multipliers far from Llama's implicit ones, so that a missing one changes the output.
    config = transformers.GraniteConfig(
        vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=True, embedding_multiplier=6.0, attention_multiplier=0.5,
        residual_multiplier=0.3, logits_scaling=4.0)
    return make_random_model(str(tmp_path_factory.mktemp("granite")), config, vocab_tokenizer)


@pytest.fixture(scope="module")
def reference(granite_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(granite_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # as ignore_eos
    return model


@pytest.fixture(scope="module")
def expected(reference, vocab_tokenizer) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(granite_dir, expected,
                                                            vocab_tokenizer):
    with LLM(granite_dir, **ENGINE) as llm:
        runs = greedy_three_ways(llm, mixed_prompts(vocab_tokenizer), MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_tensor_parallel_equals_hf(granite_dir, expected, vocab_tokenizer):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(granite_dir, tensor_parallel_size=2, **ENGINE) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(mixed_prompts(vocab_tokenizer),
                                                              params)]
    assert got == expected


def test_logprobs_are_those_of_the_scaled_logits(granite_dir, reference, vocab_tokenizer):
    prompt = mixed_prompts(vocab_tokenizer)[-1]
    with LLM(granite_dir, **ENGINE) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1,
                                                    logprobs=3))[0].outputs[0]
    with torch.no_grad():
        want = torch.log_softmax(reference(torch.tensor([prompt])).logits[0, -1].float(), -1)
    got = out.logprobs[0]
    assert set(got) == set(want.topk(3).indices.tolist())
    for token, logprob in got.items():
        assert abs(logprob - want[token].item()) < 1e-4


def test_a_granite_gguf_is_refused_by_name(granite_dir):
    from transformers import AutoConfig

    from tokenmill.engine.models.loader import build_model
    from tokenmill.engine.models.source import ModelLoadError, ModelSource

    source = ModelSource(directory=granite_dir, gguf_file="granite-3.3-8b-instruct-Q4_K_M.gguf")
    with pytest.raises(ModelLoadError, match="Q4_K_M.gguf holds a Granite model"):
        build_model(AutoConfig.from_pretrained(granite_dir), source, 64, torch.float32,
                    torch.device("cpu"))
