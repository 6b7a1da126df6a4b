"""DeepSeek-V2 and V3 checkpoints of random weights, as transformers saves them: latent
attention over a 32-wide latent and an 8-wide rotary key, eight experts of which two run."""

from __future__ import annotations

import json
from typing import Any

import torch
from model_support import draw_correction_bias, make_random_model

KV_LORA_RANK, ROPE_DIM = 32, 8
INDEX_TOPK, INDEX_DIM = 8, 16


def deepseek_config(kind: str, vocab: int, **changes: Any) -> Any:
    """V3: a low-rank query, sigmoid routing within the 2 best of 4 groups, renormalized and
    scaled, rotary over interleaved pairs. GLM-4.7-Flash (glm4_moe_lite): V3's layers, the
    dense ones named by mlp_layer_types. V2 (as V2-Lite): a full-rank query, softmax routing
    within the best groups (by each one's best), YaRN stretching the rotary 4x with
    mscale_all_dim scaling the softmax. Mistral 4: V3's layers, softmax routing with no
    correction bias, and each query scaled by its position past a short pretraining context.
    DeepSeek-V3.2 and GLM-5 (glm_moe_dsa): V3's layers with sparse attention (an indexer
    chooses the 8 positions each query sees), GLM-5's indexer over interleaved rotary pairs
    and one layer reusing another's choice. Sarvam-105B: V3's layers, a full-rank query, one
    group of experts, YaRN. Youtu-LLM: V3's attention, no experts. MiniCPM3:
    V2's attention over halves of the rotary part, no experts, MiniCPM's multipliers."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32,
                  n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                  first_k_dense_replace=1, kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=16,
                  qk_rope_head_dim=ROPE_DIM, v_head_dim=24, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    common.update(changes)
    if kind == "deepseek_v3":
        return transformers.DeepseekV3Config(
            q_lora_rank=48, n_group=4, topk_group=2, routed_scaling_factor=2.5,
            norm_topk_prob=True, rope_interleave=True, **common)
    if kind == "mistral4":  # V3's layers, softmax routing within the 2 best of 4 groups,
        # YaRN and Llama 4's query scale past a pretraining context of 4
        return transformers.Mistral4Config(
            q_lora_rank=48, n_group=4, topk_group=2, routed_scaling_factor=2.0,
            norm_topk_prob=True, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 4, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                             "llama_4_scaling_beta": 0.5},
            **common)
    if kind == "axk1":  # V3's layers, the sparse blocks' output normalized (written as its
        # checkpoints are published by make_deepseek)
        return transformers.AXK1Config(q_lora_rank=48, n_group=4, topk_group=2,
                                       routed_scaling_factor=2.5, norm_topk_prob=True,
                                       **common)
    if kind == "sarvam_mla":  # V3's layers with a full-rank query, one group of experts,
        # YaRN as V2's (written in Sarvam's older fields by make_deepseek)
        return transformers.SarvamMLAConfig(
            q_lora_rank=None, n_group=1, topk_group=1, routed_scaling_factor=2.5,
            norm_topk_prob=True, rope_parameters=dict(SARVAM_YARN, rope_type="yarn"), **common)
    dense = {k: v for k, v in common.items()
             if not k.startswith(("n_", "num_experts", "moe_", "first_k"))}
    if kind == "youtu":  # V3's attention over Llama's MLP in every layer: no experts
        return transformers.YoutuConfig(q_lora_rank=48, **dense)
    if kind == "minicpm3":  # V2's attention (rotary over halves) over Llama's MLP, its
        # embeddings, branches and last hidden state scaled
        return transformers.MiniCPM3Config(q_lora_rank=48, scale_emb=3.0, scale_depth=1.4,
                                           dim_model_base=16, **dense)
    if kind in ("deepseek_v32", "glm_moe_dsa"):  # V3's layers, sparse attention past 8
        # positions: an indexer of 16 heads (ties in its scores unlikely) 16 wide
        sparse = dict(q_lora_rank=48, routed_scaling_factor=2.5, norm_topk_prob=True,
                      index_topk=INDEX_TOPK, index_n_heads=16, index_head_dim=INDEX_DIM)
        if kind == "deepseek_v32":
            return transformers.DeepseekV32Config(n_group=4, topk_group=2, **sparse, **common)
        # GLM-5: the middle layer reuses the first's choice
        return transformers.GlmMoeDsaConfig(n_group=1, topk_group=1,
                                            indexer_types=["full", "shared", "full"],
                                            **sparse, **common)
    if kind == "glm4_moe_lite":  # V3's layers; the dense ones listed, one group of experts
        common.pop("first_k_dense_replace")
        return transformers.Glm4MoeLiteConfig(
            q_lora_rank=48, n_group=1, topk_group=1, routed_scaling_factor=1.8,
            norm_topk_prob=True, mlp_layer_types=["dense", "sparse", "dense"], **common)
    return transformers.DeepseekV2Config(
        q_lora_rank=None, topk_method="group_limited_greedy", n_group=4, topk_group=2,
        routed_scaling_factor=1.5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128, "mscale": 1.0,
                         "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1},
        **common)


SARVAM_YARN = {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
               "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}


def _as_sarvam_publishes(directory: str) -> None:
    """Sarvam-105B's config.json as published, for its remote code: its architecture's own
    name, the experts' counts under other names, a head_dim of the cached row's width and
    YaRN as deepseek_yarn."""
    with open(f"{directory}/config.json") as f:
        config = json.load(f)
    config.pop("rope_parameters")
    config.update(architectures=["SarvamMLAForCausalLM"],
                  num_experts=config.pop("n_routed_experts"),
                  num_shared_experts=config.pop("n_shared_experts"),
                  head_dim=KV_LORA_RANK + ROPE_DIM,
                  rope_scaling=dict(SARVAM_YARN, type="deepseek_yarn"),
                  rope_theta=SARVAM_YARN["rope_theta"])
    with open(f"{directory}/config.json", "w") as f:
        json.dump(config, f)


def _as_axk1_publishes(directory: str) -> str:
    """A.X K1's checkpoint as published: no routing correction bias, and the sparse blocks'
    output norm for the dense layer too (which nothing reads)."""
    from safetensors.torch import load_file, save_file

    path = f"{directory}/model.safetensors"
    tensors = {name: t for name, t in load_file(path).items()
               if not name.endswith("e_score_correction_bias")}
    tensors["model.layers.0.post_mlp_layernorm.weight"] = torch.full((64,), 5.0)
    save_file(tensors, path, metadata={"format": "pt"})
    return directory


# transformers' class of a kind no auto class maps to its causal model.
HF_CLASSES = {"mistral4": "Mistral4ForCausalLM"}


def hf_class(directory: str) -> str:
    """The transformers class (or auto class) that reads the checkpoint in `directory`."""
    with open(f"{directory}/config.json") as f:
        return HF_CLASSES.get(json.load(f)["model_type"], "AutoModelForCausalLM")


def make_deepseek(directory: str, kind: str, tokenizer: Any, **changes: Any) -> str:
    """The checkpoint, its norms drawn (so each one's weight matters) and V3's correction bias
    too (transformers starts it at zero; drawn, it decides which experts are chosen)."""
    make_random_model(directory, deepseek_config(kind, len(tokenizer), **changes), tokenizer,
                      draw_norms=True, auto_class=HF_CLASSES.get(kind, "AutoModelForCausalLM"))
    if kind == "sarvam_mla":
        _as_sarvam_publishes(directory)
    if kind == "axk1":
        return _as_axk1_publishes(directory)
    return draw_correction_bias(directory)
