"""Gemma 4's text model (`Gemma4ForCausalLM`, and the language model of
`Gemma4ForConditionalGeneration`): sliding layers of one head size and full-attention layers of
another, with fewer KV heads whose values are the keys' projection; q, k and v normalized per
head, scores unscaled, proportional rotary on the full layers, a learned scalar per layer;
26B-A4B's experts beside the MLP; E2B's and E4B's per-layer inputs and shared KV.
Greedy output and log-probabilities equal transformers (batched, chunked, from the prefix
cache, over two tensor-parallel ranks); each layer's KV view has its own shape in one pool."""

from __future__ import annotations

import pytest
import torch
from gemma4_support import LAYERS, gemma4_config
from model_support import (
    greedy_three_ways,
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_logprobs,
    hf_reference,
    make_random_model,
    mixed_prompts,
)
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              dtype="float32")
def _make(directory: str, config, tokenizer) -> str:
    """Norms drawn, and each layer's scalar too (a buffer transformers starts at 1, which
    would hide a missing one)."""
    make_random_model(directory, config, tokenizer, draw_norms=True)
    path = f"{directory}/model.safetensors"
    tensors = load_file(path)
    scalars = [name for name in tensors if name.endswith("layer_scalar")]
    assert len(scalars) == config.num_hidden_layers
    for i, name in enumerate(scalars):
        tensors[name] = torch.tensor([0.6 + 0.3 * i])
    save_file(tensors, path, metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory, vocab_tokenizer) -> str:
    return _make(str(tmp_path_factory.mktemp("gemma4")), gemma4_config(len(vocab_tokenizer)),
                 vocab_tokenizer)


@pytest.fixture(scope="module")
def reference(gemma4_dir):
    return hf_reference(gemma4_dir)


def test_greedy_and_logprobs_equal_transformers(gemma4_dir, reference, vocab_tokenizer):
    prompts = mixed_prompts(vocab_tokenizer)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(gemma4_dir, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_experts_beside_the_mlp_equal_transformers(tmp_path, vocab_tokenizer):
    """26B-A4B's layers: four experts of which two run per token, chosen from the residual
    stream by the router (its scale and each expert's drawn), their normalized sum added to
    the MLP's normalized output; read from the two stacked tensors per layer."""
    config = gemma4_config(len(vocab_tokenizer), enable_moe_block=True, num_experts=4,
                           top_k_experts=2, moe_intermediate_size=32)
    directory = _make(str(tmp_path), config, vocab_tokenizer)
    reference = hf_reference(directory)
    prompts = mixed_prompts(vocab_tokenizer)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, **ENGINE) as llm:
        assert len(llm.engine.runner.model.model.layers[0].moe.experts) == 4
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_each_layer_sees_its_own_heads_in_one_pool(gemma4_dir):
    with LLM(gemma4_dir, **ENGINE) as llm:
        runner = llm.engine.runner
        assert runner.kv_pool.shape[-2:] == (2, 16)  # the widest rows: the sliding layers'
        shapes = [tuple(cache.k.shape[-2:]) for cache in runner.kv_caches]
        assert shapes == [(2, 16), (1, 32), (2, 16), (1, 32)]
        assert all(c.k.data_ptr() == runner.kv_pool[i, 0].data_ptr()
                   for i, c in enumerate(runner.kv_caches))
        layer = runner.model.model.layers[1].self_attn
        assert layer.values_from_keys and not hasattr(layer.qkv_proj, "v_proj")


def test_an_int8_kv_cache_stays_close(gemma4_dir, reference, vocab_tokenizer):
    """Scales per token and head in the narrower layers' views too: each token the engine
    picks has, under the reference model, a log-probability within 0.15 of the engine's."""
    prompts = mixed_prompts(vocab_tokenizer)[-2:]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    with LLM(gemma4_dir, kv_cache_dtype="int8", **ENGINE) as llm:
        outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    for prompt, out in zip(prompts, outputs, strict=True):
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(hf_logprobs(reference, prompt, out.token_ids), abs=0.15)


def test_per_layer_inputs_and_shared_kv_equal_transformers(tmp_path, vocab_tokenizer):
    """E2B's and E4B's layers: a small input embedding per layer gated into the stream, the
    last two layers reading the keys and values of the last layer of their kind before them
    (no pool rows of their own) with an MLP twice as wide."""
    config = gemma4_config(len(vocab_tokenizer), num_hidden_layers=6,
                           layer_types=LAYERS + LAYERS[:2], hidden_size_per_layer_input=8,
                           vocab_size_per_layer_input=len(vocab_tokenizer),
                           num_kv_shared_layers=2, use_double_wide_mlp=True)
    directory = _make(str(tmp_path), config, vocab_tokenizer)
    reference = hf_reference(directory)
    prompts = mixed_prompts(vocab_tokenizer)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, **ENGINE) as llm:
        runner = llm.engine.runner
        assert runner.kv_pool.shape[0] == 4  # the storing layers only
        caches = runner.kv_caches
        assert [c.k.data_ptr() for c in caches[4:]] == [c.k.data_ptr() for c in caches[2:4]]
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


@pytest.mark.parametrize("kind", ["base", "experts", "per_layer_inputs"])
def test_tensor_parallel_equals_transformers(tmp_path, vocab_tokenizer, kind):
    """Two ranks: each holds two of the four query heads in every layer, one of the sliding
    layers' two KV heads and the full layers' one (on both), half of the MLP (twice as wide in
    the shared-KV layers) and of every expert, whose sum joins across ranks before its norm;
    the per-layer inputs whole on each."""
    changes = {"experts": dict(enable_moe_block=True, num_experts=4, top_k_experts=2,
                               moe_intermediate_size=32),
               "per_layer_inputs": dict(num_hidden_layers=6, layer_types=LAYERS + LAYERS[:2],
                                        hidden_size_per_layer_input=8,
                                        vocab_size_per_layer_input=len(vocab_tokenizer),
                                        num_kv_shared_layers=2, use_double_wide_mlp=True),
               }.get(kind, {})
    directory = _make(str(tmp_path), gemma4_config(len(vocab_tokenizer), **changes),
                      vocab_tokenizer)
    reference = hf_reference(directory)
    prompts = mixed_prompts(vocab_tokenizer)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        runner = llm.engine.runner
        assert [tuple(c.k.shape[-2:]) for c in runner.kv_caches[:4]] == [(1, 16), (1, 32)] * 2
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_tensor_parallel_sizes_that_split_a_layers_kv_heads_unevenly_are_refused(
        tmp_path, vocab_tokenizer):
    directory = _make(str(tmp_path), gemma4_config(len(vocab_tokenizer), num_attention_heads=6,
                                                   num_global_key_value_heads=3),
                      vocab_tokenizer)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*3 KV heads"):
        LLM(directory, tensor_parallel_size=2, **ENGINE)


def test_the_pool_is_sized_by_its_widest_rows(gemma4_dir):
    from tokenmill.engine.execution.kv_layout import KVCacheLayout
    from tokenmill.engine.models.loader import load_config
    from tokenmill.engine.models.source import ModelSource

    config = load_config(ModelSource(directory=gemma4_dir))
    layout = KVCacheLayout.for_model(config, 8, torch.float32)
    assert (layout.num_kv_heads, layout.head_dim) == (2, 16)
    assert layout.bytes_per_token == 2 * 4 * 2 * 16 * 4
    quantized = KVCacheLayout.for_model(config, 8, torch.float32, "int8")
    assert quantized.bytes_per_token == 2 * 4 * (2 * 16 + 2 * 4)
