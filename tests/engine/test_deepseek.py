"""DeepSeek-V2 and V3 (and Sarvam-105B, V3's layers; A.X K1, the sparse blocks' output
normalized), GLM-4.7-Flash and Mistral Small 4 (multi-head latent attention, DeepSeek's expert
routing; Mistral 4's by softmax, its queries scaled by position), DeepSeek-V3.2 and GLM-5
(sparse attention past the indexer's top positions), Youtu-LLM and MiniCPM3 (no experts):
greedy output equals Hugging Face token for token (batched, chunked, from the prefix cache,
under tensor parallelism; a quantized model's within its tolerance), and the KV cache keeps one
latent row per token and layer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from deepseek_support import INDEX_DIM, KV_LORA_RANK, ROPE_DIM, hf_class, make_deepseek
from model_support import (
    greedy_three_ways,
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_logprobs,
    hf_reference,
    mixed_prompts,
)

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.layers.moe import route_grouped
from tokenmill.engine.layers.quantized_linear import QuantizedLinear
from tokenmill.engine.models.latent_attention import LatentSelfAttention

MAX_NEW = 12
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


@pytest.fixture(scope="module",
                params=["deepseek_v3", "deepseek_v2", "glm4_moe_lite", "mistral4", "deepseek_v32",
                        "glm_moe_dsa", "youtu", "minicpm3", "sarvam_mla", "axk1"])
def deepseek_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    return make_deepseek(str(tmp_path_factory.mktemp(request.param)), request.param,
                         vocab_tokenizer)


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def reference(deepseek_dir) -> Any:
    return hf_reference(deepseek_dir, hf_class(deepseek_dir))


@pytest.fixture(scope="module")
def expected(reference, vocab_tokenizer) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(deepseek_dir, reference, expected,
                                                            vocab_tokenizer):
    prompts = mixed_prompts(vocab_tokenizer)
    with LLM(deepseek_dir, **ENGINE) as llm:
        runner = llm.engine.runner
        assert any(isinstance(m, LatentSelfAttention) for m in runner.model.modules())
        # One row per token and layer: the latent and the rotary key (and the sparse
        # attention indexer's key), read as both K and V.
        assert runner.layout.planes == 1
        sparse = llm.engine.model_config.model_type in ("deepseek_v32", "glm_moe_dsa")
        assert runner.layout.head_dim == KV_LORA_RANK + ROPE_DIM + (INDEX_DIM if sparse else 0)
        assert runner.layout.num_kv_heads == 1
        cache = runner.kv_caches[0]
        assert cache.k.data_ptr() == cache.v.data_ptr()
        if sparse:  # GLM-5's shared layer has no indexer of its own
            kinds = ["full", "shared", "full"] if "glm" in deepseek_dir else ["full"] * 3
            layers = runner.model.model.layers
            assert [layer.self_attn.indexer is not None for layer in layers] == \
                [kind == "full" for kind in kinds]
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


# Families whose latent attention splits over ranks, quantizes and refuses adapters as
# DeepSeek-V3's does (Sarvam-105B's layers are V3's; Youtu-LLM's and MiniCPM3's over a dense
# MLP as any other): their runs of those would repeat V3's.
AS_DEEPSEEK_V3 = ("youtu", "minicpm3", "sarvam_mla")


def _skip_as_v3(deepseek_dir: str) -> None:
    if deepseek_dir.rstrip("/").rpartition("/")[2].startswith(AS_DEEPSEEK_V3):
        pytest.skip("splits, quantizes and refuses adapters as DeepSeek-V3 (AS_DEEPSEEK_V3)")


def test_tensor_parallel_equals_hf(deepseek_dir, reference, expected, vocab_tokenizer):
    """Two ranks: each holds half the heads (q, kv_b_proj, o_proj) and every expert's half
    width; the latent's projections and its cache are whole on both."""
    _skip_as_v3(deepseek_dir)
    with LLM(deepseek_dir, tensor_parallel_size=2, **ENGINE) as llm:
        attn = next(m for m in llm.engine.runner.model.modules()
                    if isinstance(m, LatentSelfAttention))
        assert attn.num_heads == 2
        prompts = mixed_prompts(vocab_tokenizer)
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_int8_weights_and_kv_cache_stay_close(deepseek_dir, reference, vocab_tokenizer):
    """The projections in int8 but kv_b_proj, which attention reads as matrices; the one latent
    row quantized once for K and V alike. Each token the quantized engine picks has, under the
    reference model, a log-probability within 0.15 of what the engine gives it (rounding may
    flip a near tie, so the tokens themselves may differ; the exact layout is the float32
    tests' to show)."""
    _skip_as_v3(deepseek_dir)
    prompts = mixed_prompts(vocab_tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    with LLM(deepseek_dir, kv_cache_dtype="int8", quantization="int8", **ENGINE) as llm:
        attn = next(m for m in llm.engine.runner.model.modules()
                    if isinstance(m, LatentSelfAttention))
        assert isinstance(attn.o_proj, QuantizedLinear)
        assert attn.kv_b_proj.weight.dtype == torch.float32
        outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    for prompt, out in zip(prompts, outputs, strict=True):
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(hf_logprobs(reference, prompt, out.token_ids), abs=0.15)


def test_v2_routing_picks_by_softmax_within_the_best_groups():
    """DeepSeek-V2's group_limited_greedy, row by row: groups ranked by their best softmax
    score, the top experts among the best groups' weighed by their softmax scores, scaled."""
    torch.manual_seed(2)
    logits = torch.randn(6, 8)
    weights, ids = route_grouped(logits, None, top_k=3, groups=4, topk_group=2,
                                 renormalize=False, scale=1.5, softmax=True, group_top=1)
    probs = torch.softmax(logits, dim=-1)
    for row in range(6):
        best_groups = set(probs[row].view(4, 2).amax(dim=1).topk(2).indices.tolist())
        eligible = [e for e in range(8) if e // 2 in best_groups]
        chosen = sorted(eligible, key=lambda e: -probs[row, e])[:3]
        assert sorted(ids[row].tolist()) == sorted(chosen)
        torch.testing.assert_close(weights[row], probs[row, ids[row]] * 1.5)


def test_lora_is_refused_at_start_up(deepseek_dir):
    """Adapters target q/k/v projections latent attention does not have: refused by name
    rather than served half-applied."""
    _skip_as_v3(deepseek_dir)
    with pytest.raises(ConfigError, match="enable_lora: LoRA adapters are not served on "
                                          "\\w+ForCausalLM's latent attention"):
        LLM(deepseek_dir, enable_lora=True, **ENGINE)


def test_sparse_attention_that_cannot_work_is_refused_at_load(vocab_tokenizer):
    """A shared layer reuses the choice of a full one before it: none before the first."""
    from deepseek_support import deepseek_config

    from tokenmill.engine.models.architecture import check_features
    from tokenmill.engine.models.source import ModelLoadError

    config = deepseek_config("glm_moe_dsa", len(vocab_tokenizer))
    check_features(config)
    config.indexer_types = ["shared", "full", "full"]
    with pytest.raises(ModelLoadError, match="indexer_types .* the first layer's 'full'"):
        check_features(config)


def test_cuda_graphs_stay_off_for_sparse_attention():
    """Its layers choose dense or sparse attention by the step's context lengths on the host,
    which a replayed graph would not see."""
    from tokenmill.engine.execution.decode_graphs import graphs_wanted

    assert graphs_wanted("cuda", "triton", enforce_eager=False)
    assert not graphs_wanted("cuda", "triton", enforce_eager=False, sparse_attention=True)
