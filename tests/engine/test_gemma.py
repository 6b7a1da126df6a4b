"""Gemma 1, 2 and 3 (text) and VaultGemma: greedy output equals Hugging Face token for token
(batched, chunked, from the prefix cache, past the sliding window, under tensor parallelism),
Gemma 2's soft-capped logits give HF's log-probabilities, and what the engine does not read is
refused by name."""

from __future__ import annotations

import pytest
import torch
from model_support import (
    greedy_three_ways,
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
)

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.architecture import activation_of, layer_window_of
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.source import ModelLoadError, ModelSource

MAX_NEW = 10
WINDOW = 16
# Small steps: long prompts are prefilled in chunks of 32 tokens over 8-token blocks.
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def _config(kind: str, vocab: int):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "gemma":
        return transformers.GemmaConfig(**common)
    if kind == "gemma2":
        # Soft caps small enough to bite on random weights; a query scale other than the head's.
        return transformers.Gemma2Config(
            sliding_window=WINDOW, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
            query_pre_attn_scalar=24, **common)
    if kind == "vaultgemma":  # Gemma 2's attention and soft caps, two norms per layer
        return transformers.VaultGemmaConfig(
            sliding_window=WINDOW, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
            query_pre_attn_scalar=24, **common)
    # Gemma 3: two sliding layers to one full; the full layers' rope is stretched (linear) on
    # another base than the sliding layers'.
    return transformers.Gemma3TextConfig(
        sliding_window=WINDOW, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        **common)


def _make(directory: str, config, tokenizer) -> str:
    return make_random_model(directory, config, tokenizer, draw_norms=True)


@pytest.fixture(scope="module", params=["gemma", "gemma2", "gemma3", "vaultgemma"])
def gemma_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    directory = str(tmp_path_factory.mktemp(request.param))
    return _make(directory, _config(request.param, len(vocab_tokenizer)), vocab_tokenizer)


def _prompts(tokenizer) -> list[list[int]]:
    """Short prompts and ones several windows long (their decodes slide too)."""
    return mixed_prompts(tokenizer)


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _reference(directory: str):
    return hf_reference(directory, attn_implementation="eager")


@pytest.fixture(scope="module")
def expected(gemma_dir, vocab_tokenizer) -> list[list[int]]:
    reference = _reference(gemma_dir)
    return [hf_greedy(reference, p, MAX_NEW) for p in _prompts(vocab_tokenizer)]


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(gemma_dir, expected,
                                                            vocab_tokenizer):
    prompts = _prompts(vocab_tokenizer)
    assert max(len(p) for p in prompts) > 3 * WINDOW
    with LLM(gemma_dir, **ENGINE) as llm:
        assert llm.engine.max_model_len == 512  # the window does not bound the context
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_tensor_parallel_equals_hf(gemma_dir, expected, vocab_tokenizer):
    with LLM(gemma_dir, tensor_parallel_size=2, **ENGINE) as llm:
        assert _greedy(llm, _prompts(vocab_tokenizer)) == expected


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory, vocab_tokenizer) -> str:
    directory = str(tmp_path_factory.mktemp("gemma2-logprobs"))
    return _make(directory, _config("gemma2", len(vocab_tokenizer)), vocab_tokenizer)


def test_soft_capped_logits_give_hfs_logprobs(gemma2_dir, vocab_tokenizer):
    """Gemma 2 passes its logits through 3 * tanh(logits / 3): the greedy choice is the same
    either way, the log-probabilities are not."""
    prompt = _prompts(vocab_tokenizer)[-1]
    with LLM(gemma2_dir, **ENGINE) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1,
                                                    logprobs=3))[0].outputs[0]
    reference = _reference(gemma2_dir)
    with torch.no_grad():
        logits = reference(torch.tensor([prompt])).logits[0, -1]
    assert logits.abs().max() <= 3.0  # HF's own logits are capped
    want = torch.log_softmax(logits.float(), dim=-1)
    got = out.logprobs[0]
    assert set(got) == set(want.topk(3).indices.tolist())
    for token, logprob in got.items():
        assert abs(logprob - want[token].item()) < 1e-4


def test_which_layers_slide_and_how_gemma_is_read(vocab_tokenizer):
    gemma2 = _config("gemma2", 100)
    assert [layer_window_of(gemma2, i) for i in range(4)] == [WINDOW, None, WINDOW, None]
    gemma3 = _config("gemma3", 100)
    assert [layer_window_of(gemma3, i) for i in range(4)] == [WINDOW, WINDOW, None, WINDOW]
    assert activation_of(gemma3) == "gelu_pytorch_tanh"
    gemma2.hidden_activation = "relu"
    with pytest.raises(ModelLoadError, match="activation 'relu' is not supported"):
        activation_of(gemma2)


def test_an_encoder_gemma_is_refused(tmp_path, vocab_tokenizer):
    """EmbeddingGemma attends both ways: the causal engine would give other vectors."""
    config = _config("gemma3", len(vocab_tokenizer))
    config.use_bidirectional_attention = True
    directory = _make(str(tmp_path / "m"), config, vocab_tokenizer)
    with pytest.raises(ModelLoadError, match="attends in both directions"):
        LLM(directory, **ENGINE)


def test_a_gemma_gguf_is_refused_by_name(gemma2_dir):
    config = _config("gemma2", 100)
    source = ModelSource(directory=gemma2_dir, gguf_file="gemma-2-9b-it-Q4_K_M.gguf")
    with pytest.raises(ModelLoadError, match="gemma-2-9b-it-Q4_K_M.gguf holds a Gemma model"):
        build_model(config, source, 64, torch.float32, torch.device("cpu"))

