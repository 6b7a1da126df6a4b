"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE, GraniteMoE and GraniteMoeShared,
GLM-4.5, MiniMax-M2, dots.llm1, K-EXAONE, MiMo-V2-Flash, Trinity, ERNIE 4.5, Solar Open,
Hunyuan-A13B and Hunyuan 3, FlexOlmo, DBRX, Flint, Kolibri, Sarvam-30B, Command A+, Mellum,
Laguna): greedy output equals Hugging Face token for token (batched, chunked, from the prefix
cache, under tensor parallelism), the router math equals a dense reference, and what a sparse
layer cannot take is refused by name."""

from __future__ import annotations

import pytest
import torch
from lora_support import Adapter, make_adapter, peft_greedy
from model_support import (
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
    update_config_json,
)
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import LoRAAdapterError
from tokenmill.engine.execution.decode_graphs import graphs_wanted
from tokenmill.engine.layers.moe import experts_sum, route, route_grouped
from tokenmill.engine.layers.quantized_linear import QuantizedLinear, QuantizedMergedLinear
from tokenmill.engine.models.gguf_weights import hf_name
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.moe import Router, SparseMoeBlock
from tokenmill.engine.models.quantize import weight_bytes
from tokenmill.engine.models.source import ModelLoadError, ModelSource

MAX_NEW = 12
# Small steps: long prompts are prefilled in chunks of 32 tokens over 8-token blocks.
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def _config(kind: str, vocab: int, **changes):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                  eos_token_id=2, tie_word_embeddings=False)
    common.update(changes)
    if kind == "qwen3_moe":
        # Layer 1 is dense (mlp_only_layers); the chosen weights are renormalized.
        return transformers.Qwen3MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, head_dim=16, norm_topk_prob=True, mlp_only_layers=[1],
            **common)
    if kind.startswith("laguna"):
        # Per-head q/k norms, a sliding layer between full ones (each kind its rotary, the
        # full ones' over half of each head), attention's output times the softplus of a gate
        # per head (-element: per number); experts chosen by the sigmoids of soft-capped
        # logits plus a bias, renormalized and scaled, beside a shared expert; layer 0 dense.
        return transformers.LagunaConfig(
            intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            num_experts=8, num_experts_per_tok=2, head_dim=16, sliding_window=6,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            gating="per-element" if kind.endswith("element") else "per-head",
            moe_router_logit_softcapping=1.5, moe_routed_scaling_factor=2.5, **common)
    if kind == "mellum":
        # Qwen3-MoE's layers: a sliding layer between full ones, each kind its rotary base,
        # the first layer dense (mlp_layer_types); a prediction layer under mtp., unread.
        return transformers.MellumConfig(
            intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, head_dim=16, sliding_window=6,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse"], **common)
    if kind == "qwen2_moe":
        # A shared expert beside four routed ones; the chosen weights are not renormalized.
        return transformers.Qwen2MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
            num_experts=4, num_experts_per_tok=2, **common)
    if kind == "glm4_moe":
        # DeepSeek-V3's routing: 8 experts in 4 groups, the 2 best groups eligible; a shared
        # expert; layer 0 dense; q/k norms, biases on q, k and v, rotary on half of each head.
        return transformers.Glm4MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
            n_shared_experts=1, routed_scaling_factor=2.5, head_dim=16,
            partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True,
            num_nextn_predict_layers=1, **common)
    if kind == "sarvam_moe":
        # GLM-4.5's layers with rotary over the whole head, no biases, in one group of
        # experts, under Bailing's names (q, k and v fused, word_embeddings, expert_bias).
        return transformers.SarvamMoEConfig(
            intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
            n_shared_experts=1, routed_scaling_factor=2.5, head_dim=16, **common)
    if kind.startswith("cohere2_moe"):
        # Command R7B's parallel layers (LayerNorm, rotary over interleaved pairs, the full
        # layer after a sliding one without positions), the first layer dense (a width of its
        # own) and turned; experts chosen by their logits, weighted by their sigmoids, averaged
        # with two shared experts. -softmax: softmax weights, the shared experts summed,
        # RMSNorms.
        softmax = kind.endswith("softmax")
        return transformers.Cohere2MoeConfig(
            intermediate_size=32, prefix_dense_intermediate_size=48, num_experts=8,
            num_experts_per_tok=2, num_shared_experts=2, first_k_dense_replace=1,
            expert_selection_fn="softmax" if softmax else "sigmoid", norm_topk_prob=False,
            shared_expert_combination_strategy="sum" if softmax else "average",
            rms_norm_eps=1e-5 if softmax else None, sliding_window=6,
            sliding_window_pattern=2, head_dim=16, logit_scale=0.5, **common)
    if kind == "solar_open":
        # Llama's attention (biases on q, k and v) over GLM-4.5's routing, no dense layer.
        return transformers.SolarOpenConfig(
            moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
            topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, head_dim=16,
            attention_bias=True, **common)
    if kind == "ernie4_5_moe":
        # ERNIE's attention (rotary over interleaved pairs); softmax scores plus a correction
        # bias choose, renormalized; a shared expert; layer 0 dense (moe_layer_start_index).
        return transformers.Ernie4_5_MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, moe_num_experts=8, moe_k=2,
            moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=-1,
            head_dim=16, **common)
    if kind == "dots1":
        # Qwen3's per-head q/k norms over DeepSeek-V3's routing (8 experts in 4 groups, the 2
        # best eligible), a shared expert, layer 0 dense.
        return transformers.Dots1Config(
            intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
            n_shared_experts=1, routed_scaling_factor=2.0, norm_topk_prob=True, head_dim=16,
            **common)
    if kind == "exaone_moe":
        # EXAONE 4's attention (per-head q/k norms, a full layer without positional encoding
        # after two sliding ones) in pre-norm layers over DeepSeek-V3's routing (8 experts in
        # 4 groups, the 2 best eligible), a shared expert, layer 0 dense.
        return transformers.ExaoneMoeConfig(
            intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
            num_shared_experts=1, routed_scaling_factor=2.0, head_dim=16, sliding_window=6,
            sliding_window_pattern=3, **common)
    if kind == "hy_v3":
        # Hunyuan 3: per-head q/k norms; sigmoid routing by score plus a bias (beside the
        # router in its checkpoints), renormalized and scaled, beside a shared expert; layer 0
        # dense.
        return transformers.HYV3Config(
            intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, num_shared_experts=1, router_scaling_factor=2.0,
            head_dim=16, **common)
    if kind == "afmoe":
        # Arcee's Trinity: per-head q/k norms, rotary in the sliding layers only, the output
        # gated, a norm before and after each branch; sigmoid routing by score plus a bias,
        # renormalized and scaled, beside a shared expert; layer 0 dense; muP's embeddings.
        return transformers.AfmoeConfig(
            intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1, route_scale=2.5,
            head_dim=16, global_attn_every_n_layers=3, sliding_window=6, mup_enabled=True,
            **common)
    if kind == "flint":
        # Per-head q/k norms, attention sinks in every layer, rotary in the sliding layers
        # only; sigmoid scores choose (no bias), renormalized, beside a shared expert added
        # as it is; layer 0 dense.
        return transformers.FlintConfig(
            intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, head_dim=16,
            sliding_window=6, mlp_only_layers=[0],
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], **common)
    if kind == "kolibri1":
        # Per-head q/k norms, rotary in the sliding layers only, a norm before and after each
        # branch; experts chosen by their logits plus a bias, weighted by those logits'
        # sigmoids, renormalized, beside a shared expert, in every layer.
        return transformers.Kolibri1Config(
            moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, head_dim=16, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], **common)
    if kind == "mimo_v2_flash":
        # A full layer, then two sliding ones with twice the KV heads and attention sinks;
        # values narrower than keys and scaled; rotary over a third of each head, its base per
        # kind of layer; DeepSeek-V3's routing (8 experts in 4 groups, the 2 best eligible)
        # without shared experts, layer 0 dense.
        return transformers.MiMoV2FlashConfig(
            intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, head_dim=32, v_head_dim=16,
            sliding_window=8, **common)
    if kind == "minimax_m2":
        # Sigmoid scores plus a correction bias choose, renormalized; q and k normalized over
        # the whole projection; rotary on half of each head.
        return transformers.MiniMaxM2Config(
            intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, head_dim=16,
            rotary_dim=8, **common)
    if kind == "hunyuan_v1_moe":
        # Hunyuan's q and k norms after the turn; experts beside a shared MLP as wide, the
        # router in float32.
        return transformers.HunYuanMoEV1Config(
            intermediate_size=32, num_experts=4, head_dim=16, **{"moe_topk": [2, 2, 2], **common})
    if kind == "granitemoeshared":
        # GraniteMoE's multipliers and experts beside a shared MLP of another width.
        return transformers.GraniteMoeSharedConfig(
            intermediate_size=32, shared_intermediate_size=48, num_local_experts=4,
            num_experts_per_tok=2, embedding_multiplier=2.0, attention_multiplier=0.25,
            residual_multiplier=0.8, logits_scaling=2.0, **common)
    if kind == "granitemoe_swa":
        # GraniteMoeShared's experts without the shared MLP (its default), sliding layers with
        # a rotary base of their own, the full one without positional encoding, sinks drawn.
        return transformers.GraniteMoeSWAConfig(
            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
            embedding_multiplier=2.0, attention_multiplier=0.25, residual_multiplier=0.8,
            logits_scaling=2.0, sliding_window=6, layer_rope_theta=[0, 500.0, 500.0], **common)
    if kind == "flex_olmo":  # OLMo 2's norms after each branch, q and k normalized whole
        return transformers.FlexOlmoConfig(intermediate_size=32, num_experts=4,
                                           num_experts_per_tok=2, pad_token_id=0, **common)
    if kind == "granitemoe":
        # Granite's multipliers; the experts stored as one tensor per layer.
        return transformers.GraniteMoeConfig(
            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
            embedding_multiplier=2.0, attention_multiplier=0.25, residual_multiplier=0.8,
            logits_scaling=2.0, **common)
    if kind == "dbrx":  # its own names; q, k and v fused and clamped, norms without biases
        return transformers.DbrxConfig(
            vocab_size=vocab, d_model=64, n_heads=4, n_layers=3, max_seq_len=512,
            attn_config={"kv_n_heads": 2, "clip_qkv": 0.4, "rope_theta": 10000.0},
            ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
            bos_token_id=1, eos_token_id=2, **changes)
    if kind == "phimoe":  # LayerNorm, biases on q, k, v, o and the LM head; sparsemixer's
        # threshold wide enough that several experts share each softmax
        return transformers.PhimoeConfig(intermediate_size=32, num_local_experts=4,
                                         num_experts_per_tok=2, attention_bias=True,
                                         lm_head_bias=True, router_jitter_noise=0.3, **common)
    return transformers.MixtralConfig(intermediate_size=32, num_local_experts=4,
                                      num_experts_per_tok=2, **common)


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "qwen2_moe", "granitemoe",
                                        "glm4_moe", "minimax_m2", "dots1", "ernie4_5_moe",
                                        "solar_open", "hunyuan_v1_moe", "flex_olmo",
                                        "granitemoeshared", "granitemoe_swa", "dbrx",
                                        "phimoe", "exaone_moe", "mimo_v2_flash", "afmoe",
                                        "hy_v3", "flint", "kolibri1", "sarvam_moe",
                                        "cohere2_moe", "cohere2_moe-softmax", "mellum",
                                        "laguna", "laguna-element"])
def moe_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    directory = str(tmp_path_factory.mktemp(request.param))
    make_random_model(directory, _config(request.param, len(vocab_tokenizer)), vocab_tokenizer,
                      draw_norms=request.param in ("minimax_m2", "dots1", "ernie4_5_moe",
                                                   "exaone_moe", "hunyuan_v1_moe", "flex_olmo",
                                                   "dbrx", "mimo_v2_flash", "hy_v3",
                                                   "phimoe", "granitemoe_swa", "flint",
                                                   "kolibri1", "sarvam_moe", "cohere2_moe",
                                                   "cohere2_moe-softmax", "laguna",
                                                   "laguna-element"))
    if request.param in ("glm4_moe", "minimax_m2", "dots1", "ernie4_5_moe", "solar_open",
                         "exaone_moe", "mimo_v2_flash", "afmoe", "hy_v3", "kolibri1",
                         "sarvam_moe", "laguna", "laguna-element"):
        _draw_biases(directory, prediction_layer=request.param in ("glm4_moe", "minimax_m2",
                                                                   "dots1", "ernie4_5_moe"))
    if request.param in HUB_ARCHITECTURES:  # as the published checkpoints name theirs
        update_config_json(directory, architectures=[HUB_ARCHITECTURES[request.param]])
    if request.param in PREDICTION_HEADS:  # a multi-token-prediction layer, not run
        path = f"{directory}/model.safetensors"
        tensors = load_file(path)
        tensors[PREDICTION_HEADS[request.param]] = torch.randn(64, 128)
        save_file(tensors, path, metadata={"format": "pt"})
    return directory


# Architectures transformers saves under another family's name (its model class).
HUB_ARCHITECTURES = {"sarvam_moe": "SarvamMoEForCausalLM"}


# Where MiMo-V2-Flash, Mellum and Hunyuan 3 store their multi-token-prediction layers (Hunyuan
# 3's after the decoder's, with no count of them in its config).
PREDICTION_HEADS = {"mimo_v2_flash": "model.mtp.layers.0.eh_proj.weight",
                    "mellum": "mtp.layers.0.eh_proj.weight",
                    "hy_v3": "model.layers.3.eh_proj.weight"}


def _draw_biases(directory: str, prediction_layer: bool = True) -> None:
    """Draw the biases transformers starts at zero (GLM's and MiniMax-M2's correction bias
    among them, which then decides which experts are chosen), so where each lands shows; and
    with `prediction_layer`, add GLM-4.5's multi-token-prediction layer."""
    path = f"{directory}/model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(3)
    for name, tensor in tensors.items():
        if name.endswith(("bias", "e_score_correction_bias")):
            tensors[name] = torch.randn(tensor.shape, generator=gen) * 0.3
    if prediction_layer and "model.layers.0.mlp.gate.weight" in tensors:
        # As GLM-4.5's checkpoints, a multi-token-prediction layer after the last decoder
        # layer, which neither transformers nor the engine runs.
        tensors["model.layers.3.eh_proj.weight"] = torch.randn(64, 128, generator=gen)
    save_file(tensors, path, metadata={"format": "pt"})


def _prompts(tokenizer) -> list[list[int]]:
    return mixed_prompts(tokenizer)


def _greedy(llm: LLM, prompts: list[list[int]], **kwargs) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, **kwargs)]


@pytest.fixture(scope="module")
def reference(moe_dir):
    return hf_reference(moe_dir)


@pytest.fixture(scope="module")
def expected(reference, vocab_tokenizer) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in _prompts(vocab_tokenizer)]


def _check_weight_floor(llm: LLM) -> None:
    """A decode step's weight floor (the bandwidth bound's weights) counts top_k of each
    sparse layer's experts."""
    model = llm.engine.runner.model
    report = llm.engine.memory_report()
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    unchosen = sum(weight_bytes(b.experts) * (b.shape.num_experts - b.shape.top_k)
                   // b.shape.num_experts for b in blocks)
    embeddings = model.model.embed_tokens.weight.nbytes  # not tied: a step reads a few rows
    assert report["step_weights_bytes"] == weight_bytes(model) - embeddings - unchosen
    assert unchosen > 0


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(moe_dir, reference, expected,
                                                            vocab_tokenizer):
    """And the engine's decode-step weight floor counts only the chosen experts."""
    prompts = _prompts(vocab_tokenizer)
    with LLM(moe_dir, **ENGINE) as llm:
        blocks = [m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoeBlock)]
        assert blocks, "the model was built without its sparse blocks"
        _check_weight_floor(llm)
        batched = greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW)
        hits = llm.engine.kv.prefix_hits
        again = _greedy(llm, prompts)
        assert llm.engine.kv.prefix_hits > hits
        alone = [_greedy(llm, [p])[0] for p in prompts[:2]]
        llm.engine.kv.allocator.check_all_free()
    assert batched == expected
    assert again == expected
    assert alone == expected[:2]


def _one_of(moe_dir: str, families: tuple[str, ...]) -> bool:
    """Whether the model directory (mktemp names it after its family) is of one of these
    families, by prefix: GraniteMoE's name covers GraniteMoeShared's and GraniteMoE SWA's."""
    return moe_dir.rstrip("/").rpartition("/")[2].startswith(families)


# One family per way of routing (softmax over all experts, over the chosen ones, DeepSeek's
# grouped sigmoid with a bias, Phi-3.5-MoE's sparsemixer): a verify step's rows reach the
# experts as any step's do, whatever the family around them.
SPECULATIVE_FAMILIES = ("qwen3_moe", "mixtral", "glm4_moe", "phimoe")


def test_speculative_decoding_keeps_the_greedy_output(moe_dir, expected, vocab_tokenizer):
    """Prompt-lookup proposals verified by the MoE target: the verify steps' rows go through
    the experts like any other rows."""
    if not _one_of(moe_dir, SPECULATIVE_FAMILIES):
        pytest.skip("routes as a family the test runs (SPECULATIVE_FAMILIES)")
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    with LLM(moe_dir, speculative_config=spec, **ENGINE) as llm:
        assert _greedy(llm, _prompts(vocab_tokenizer)) == expected
        assert llm.engine.speculation_stats.num_accepted_tokens > 0


# Two ranks where the sharding differs: a gated shared expert (Qwen2-MoE), experts stored fused
# (GraniteMoE; GraniteMoeShared's shared MLP of its own width, matched by the prefix), always-on
# shared experts, dense layers and a float32 router (GLM-4.5). Qwen3-MoE's and Mixtral's plain
# experts split as those do (and as any MLP). MiMo-V2-Flash's attention splits its own way:
# its layers' KV heads differ, and its values are narrower than its keys; AFMoE's output gate
# splits by head.
TP_FAMILIES = ("qwen2_moe", "granitemoe", "glm4_moe", "solar_open", "phimoe", "mimo_v2_flash",
               "afmoe")


@pytest.mark.parametrize("size", [2])
def test_tensor_parallel_equals_hf(moe_dir, expected, vocab_tokenizer, size):
    """Every rank holds a slice of every expert's width (and of the shared expert's)."""
    if not _one_of(moe_dir, TP_FAMILIES):
        pytest.skip("plain experts split as the other families' do (TP_FAMILIES)")
    with LLM(moe_dir, tensor_parallel_size=size, **ENGINE) as llm:
        model = llm.engine.runner.model
        block = next(m for m in model.modules() if isinstance(m, SparseMoeBlock))
        assert block.experts[0].gate_up_proj.weight.shape[0] == 2 * block.shape.width // size
        assert _greedy(llm, _prompts(vocab_tokenizer)) == expected


def test_router_weights_renormalize_only_when_asked():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 3.5, 0.0]])
    probs = torch.softmax(logits, dim=-1)
    weights, ids = route(logits, 2, renormalize=False)
    assert ids.tolist() == [[0, 1], [2, 1]]
    torch.testing.assert_close(weights, probs.gather(1, ids))
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2))
    torch.testing.assert_close(weights, probs.gather(1, ids) / probs.gather(1, ids).sum(1, True))


def test_grouped_routing_picks_within_the_best_groups():
    """DeepSeek-V3's routing, row by row: rank the groups by their two best biased scores,
    keep the best, choose the top experts among theirs by biased score, weigh them by their
    unbiased scores, renormalized and scaled."""
    torch.manual_seed(1)
    logits, correction = torch.randn(6, 8), torch.randn(8) * 0.5
    weights, ids = route_grouped(logits, correction, top_k=3, groups=4, topk_group=2,
                                 renormalize=True, scale=2.5)
    scores = torch.sigmoid(logits)
    for row in range(6):
        biased = (scores[row] + correction).view(4, 2)
        best_groups = set(biased.sum(dim=1).topk(2).indices.tolist())  # two per group: both
        eligible = [e for e in range(8) if e // 2 in best_groups]
        chosen = sorted(eligible, key=lambda e: -(scores[row, e] + correction[e]))[:3]
        assert sorted(ids[row].tolist()) == sorted(chosen)
        expected = scores[row, ids[row]] / scores[row, ids[row]].sum() * 2.5
        torch.testing.assert_close(weights[row], expected)


def test_a_bias_on_the_logits_chooses_otherwise_than_on_their_sigmoids():
    """Kolibri adds its bias to the logits to choose: logits (2, 0) with bias (0, 1.5) choose
    expert 0 (2 > 1.5) where V3's sigmoid scores plus the bias choose expert 1 (0.88 < 2);
    either way the weight is the chosen logit's sigmoid."""
    logits, correction = torch.tensor([[2.0, 0.0]]), torch.tensor([0.0, 1.5])
    weights, ids = route_grouped(logits, correction, top_k=1, groups=1, topk_group=1,
                                 renormalize=False, scale=1.0, bias_on_logits=True)
    assert ids.tolist() == [[0]]
    torch.testing.assert_close(weights, torch.sigmoid(torch.tensor([[2.0]])))
    weights, ids = route_grouped(logits, correction, top_k=1, groups=1, topk_group=1,
                                 renormalize=False, scale=1.0)
    assert ids.tolist() == [[1]]
    torch.testing.assert_close(weights, torch.sigmoid(torch.tensor([[0.0]])))


def test_experts_sum_equals_the_dense_weighted_sum():
    """Rows grouped by expert equal every expert run on every row, weighted by a routing
    matrix that is zero where a row did not choose the expert (expert 4 is chosen by none)."""
    torch.manual_seed(0)
    x = torch.randn(9, 16)
    mats = torch.randn(6, 16, 16)
    choices = torch.tensor([0, 1, 2, 3, 5])
    ids = torch.stack([choices[torch.randperm(5)[:2]] for _ in range(9)])
    weights = torch.rand(9, 2)
    calls = []

    def run(e, rows):
        calls.append(e)
        return torch.tanh(rows @ mats[e])

    got = experts_sum(x, weights, ids, 6, run)
    dense = torch.zeros(9, 6).scatter_add_(1, ids, weights)
    want = sum(dense[:, e:e + 1] * torch.tanh(x @ mats[e]) for e in range(6))
    torch.testing.assert_close(got, want)
    assert sorted(calls) == sorted(set(ids.flatten().tolist()))  # unchosen experts never run


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_quantization_covers_every_expert_and_keeps_the_router(tmp_path, vocab_tokenizer,
                                                               method):
    directory = make_random_model(str(tmp_path / "m"), _config("qwen2_moe", len(vocab_tokenizer)),
                                  vocab_tokenizer)
    prompts = _prompts(vocab_tokenizer)[:3]
    with LLM(directory, **ENGINE) as llm:
        full = _greedy(llm, prompts)
    with LLM(directory, quantization=method, **ENGINE) as llm:
        block = next(m for m in llm.engine.runner.model.modules()
                     if isinstance(m, SparseMoeBlock))
        for expert in [*block.experts, block.shared_expert]:
            assert isinstance(expert.gate_up_proj, QuantizedMergedLinear)
            assert isinstance(expert.down_proj, QuantizedLinear)
        assert isinstance(block.gate, Router) and block.gate.weight.dtype == torch.float32
        quantized = _greedy(llm, prompts)
    # Quantization moves the logits a little, not the first greedy choice of these prompts.
    assert [q[0] for q in quantized] == [f[0] for f in full]


def test_an_expert_width_tensor_parallelism_cannot_split_is_refused(tmp_path, vocab_tokenizer):
    config = _config("qwen3_moe", len(vocab_tokenizer), num_attention_heads=4)
    config.moe_intermediate_size = 30  # 4 ranks cannot split it; 2 can
    directory = make_random_model(str(tmp_path / "m"), config, vocab_tokenizer)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*expert MLP width of 30"):
        LLM(directory, tensor_parallel_size=4, **ENGINE)


def test_a_checkpoint_missing_an_expert_fails_naming_it(tmp_path, vocab_tokenizer):
    directory = make_random_model(str(tmp_path / "m"), _config("mixtral", len(vocab_tokenizer)),
                                  vocab_tokenizer)
    path = f"{directory}/model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.2.block_sparse_moe.experts.3.w2.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(Exception, match=r"lacks 1 tensors.*experts\.3\.w2"):
        LLM(directory, **ENGINE)


def test_cuda_graphs_stay_off_for_a_mixture_of_experts():
    """Its layers read expert row counts on the host, which a graph capture cannot."""
    assert graphs_wanted("cuda", "triton", enforce_eager=False)
    assert not graphs_wanted("cuda", "triton", enforce_eager=False, mixture_of_experts=True)


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory, vocab_tokenizer) -> str:
    directory = str(tmp_path_factory.mktemp("lora-qwen3-moe"))
    return make_random_model(directory, _config("qwen3_moe", len(vocab_tokenizer)),
                             vocab_tokenizer)


def test_lora_on_the_attention_equals_peft(qwen3_moe_dir, tmp_path, vocab_tokenizer):
    adapter = make_adapter(qwen3_moe_dir, str(tmp_path / "a"),
                           Adapter("a", 4, 8, ["q_proj", "v_proj", "o_proj"]))
    prompts = _prompts(vocab_tokenizer)[:3]
    want = peft_greedy(qwen3_moe_dir, adapter, prompts, MAX_NEW)
    assert want != peft_greedy(qwen3_moe_dir, None, prompts, MAX_NEW)
    with LLM(qwen3_moe_dir, enable_lora=True, max_lora_rank=8, lora_modules=(f"a={adapter}",),
             **ENGINE) as llm:
        assert _greedy(llm, prompts, lora="a") == want


def test_a_lora_on_the_experts_is_refused(qwen3_moe_dir, tmp_path):
    """PEFT adapts the experts through target_parameters; and an adapter file naming a
    sparse layer's dense projections fits no module. Both are refused, by name."""
    peft_experts = make_adapter(qwen3_moe_dir, str(tmp_path / "experts"),
                                Adapter("e", 4, 8, ["q_proj", "gate_proj", "up_proj"]))
    dense = make_adapter(qwen3_moe_dir, str(tmp_path / "dense"), Adapter("d", 4, 8, ["q_proj"]))
    path = f"{dense}/adapter_model.safetensors"
    tensors = load_file(path)
    a, b = torch.zeros(4, 64), torch.zeros(32, 4)
    tensors.update({"base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight": a,
                    "base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight": b})
    save_file(tensors, path)
    with LLM(qwen3_moe_dir, enable_lora=True, max_lora_rank=8, **ENGINE) as llm:
        with pytest.raises(LoRAAdapterError, match="target_parameters"):
            llm.engine.add_lora("e", peft_experts)
        with pytest.raises(LoRAAdapterError, match="layer 0 gate_proj.*mixture of experts"):
            llm.engine.add_lora("d", dense)
        assert len(_greedy(llm, [[5, 6, 7]])[0]) == MAX_NEW  # the engine goes on serving


def test_a_mixture_of_experts_gguf_file_is_refused_naming_the_way_out(tmp_path,
                                                                     vocab_tokenizer):
    """Its stacked expert tensors are not read: the config and the first expert tensor both
    say so, and point to the safetensors checkpoint."""
    with pytest.raises(ModelLoadError, match="blk.3.ffn_gate_exps.weight.*mixture of experts"):
        hf_name("blk.3.ffn_gate_exps.weight")
    config = _config("qwen3_moe", len(vocab_tokenizer))
    source = ModelSource(directory=str(tmp_path), gguf_file="Qwen3-30B-A3B-Q4_0.gguf")
    with pytest.raises(ModelLoadError, match="Qwen3-30B-A3B-Q4_0.gguf holds a mixture of "
                                             "experts.*hf://ORG/NAME"):
        build_model(config, source, 64, torch.float32, torch.device("cpu"))


def test_a_top_k_that_differs_between_layers_is_refused(tmp_path, vocab_tokenizer):
    """Hunyuan's config may give moe_topk per layer: the same in every layer is served (the
    moe_dir case), layers that differ are refused naming the field."""
    directory = make_random_model(str(tmp_path), _config(
        "hunyuan_v1_moe", len(vocab_tokenizer), moe_topk=[2, 1, 2]), vocab_tokenizer)
    with pytest.raises(ModelLoadError, match=r"moe_topk differs between layers \(\[1, 2\]\)"):
        LLM(directory, **ENGINE)


def test_lagunas_query_heads_that_differ_between_layers_are_refused(tmp_path, vocab_tokenizer):
    """Laguna's config may give each layer its own count of query heads: one count for all
    is served (the moe_dir case), counts that differ are refused naming the field."""
    config = _config("laguna", len(vocab_tokenizer), num_attention_heads_per_layer=[4, 2, 4])
    directory = make_random_model(str(tmp_path), config, vocab_tokenizer)
    with pytest.raises(ModelLoadError, match=r"num_attention_heads_per_layer differs between "
                                             r"layers \(\[2, 4\]\)"):
        LLM(directory, **ENGINE)


@pytest.mark.parametrize("field", ["expert_selection_fn", "shared_expert_combination_strategy"])
def test_command_a_plus_ways_it_does_not_define_are_refused_by_name(tmp_path, vocab_tokenizer,
                                                                     field):
    """Command A+'s config names how experts are weighed and joined with the shared ones;
    transformers fails on any other name only when the model runs, the engine at load."""
    config = _config("cohere2_moe", len(vocab_tokenizer))
    directory = make_random_model(str(tmp_path), config, vocab_tokenizer)
    update_config_json(directory, **{field: "median"})
    with pytest.raises(ModelLoadError, match=f"{field} 'median' is not supported"):
        LLM(directory, **ENGINE)


def test_dbrxs_rotary_base_is_its_attention_configs(tmp_path, vocab_tokenizer):
    """DBRX keeps its base in attn_config (500000 as published), which transformers 5 does
    not carry into rope_parameters."""
    from tokenmill.engine.layers.rotary import rope_parameters
    from tokenmill.engine.models.loader import load_config

    config = _config("dbrx", len(vocab_tokenizer))
    config.attn_config.rope_theta = 500000.0
    config.save_pretrained(str(tmp_path))
    loaded = load_config(ModelSource(directory=str(tmp_path)))
    assert rope_parameters(loaded)["rope_theta"] == 500000.0
    assert (loaded.num_local_experts, loaded.num_experts_per_tok) == (4, 2)


def test_dbrxs_weights_normalized_by_another_norm_than_their_sum_are_refused(tmp_path,
                                                                            vocab_tokenizer):
    config = _config("dbrx", len(vocab_tokenizer))
    config.ffn_config.moe_normalize_expert_weights = 2.0
    config.save_pretrained(str(tmp_path))
    with pytest.raises(ModelLoadError, match="moe_normalize_expert_weights 2.0"):
        LLM(str(tmp_path), **ENGINE)


def test_phimoe_long_rope_scales_by_its_short_mscale_within_the_original_context(
        tmp_path, vocab_tokenizer):
    """Phi-3.5-MoE's LongRoPE multiplies cos and sin by short_mscale (long_mscale past the
    original context) in place of LongRoPE's attention factor: served within the original
    context, its short factors and short_mscale equal transformers'."""
    head = 16
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
            "short_factor": [1.0 + 0.1 * i for i in range(head // 2)],
            "long_factor": [2.0 + 0.5 * i for i in range(head // 2)],
            "short_mscale": 1.1, "long_mscale": 1.3}
    config = _config("phimoe", len(vocab_tokenizer), max_position_embeddings=256,
                     rope_parameters=rope, original_max_position_embeddings=32)
    directory = make_random_model(str(tmp_path), config, vocab_tokenizer)
    model = hf_reference(directory)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(vocab_tokenizer), (n,), generator=gen).tolist()
               for n in (10, 20)]
    with LLM(directory, max_model_len=32, **ENGINE) as llm:
        assert _greedy(llm, prompts) == [hf_greedy(model, p, MAX_NEW) for p in prompts]
