"""Checkpoints that store a layer's projections fused (Phi-3: `self_attn.qkv_proj` holds q, k
and v one after the other, `mlp.gate_up_proj` holds gate and up): each part is a range of the
fused tensor's rows, placed under its own name, so sharding, quantization and the merged
projections treat it as any checkpoint's q_proj or gate_proj.

GraniteMoE stores every expert of a layer in one tensor (`block_sparse_moe.input_linear`:
[experts, 2 * width, hidden], gate rows then up rows; `output_linear`: [experts, hidden,
width]) and its router as `block_sparse_moe.router.layer`: each expert's parts are placed under
the names of an ordinary expert's projections; so are GPT-OSS's (`mlp.experts.gate_up_proj`,
[experts, hidden, 2 * width] with gate and up columns interleaved, `down_proj`, and their
biases) and Qwen3-VL-MoE's and Mistral 4's (`mlp.experts.gate_up_proj`, gate then up, and
`down_proj`); so are Qwen3-Next's gated delta nets' input projections, fused per key head,
and GPT-NeoX's q, k and v, fused per head.
GLM-4's norms are renamed to Gemma 2's, StarCoder 2's MLP (c_fc, c_proj) to Arcee's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tokenmill.engine.contract.model_shape import (
    ModelShape,
    linear_attention_of,
    num_experts_of,
)
from tokenmill.engine.models.architecture import (
    LAGUNA,
    QWEN3_5_MOE,
    QWEN3_VL_MOE,
    output_gate_of,
)
from tokenmill.engine.models.decoder import head_dim_of, num_kv_heads_of


def fused_parts(config: Any, name: str) -> list[tuple[str, int, int]] | None:
    """(part name, first row, end row) of each part of fused checkpoint tensor `name`, or
    None for a tensor that is not a fused projection."""
    module, _, attr = name.rpartition(".")
    parent, _, kind = module.rpartition(".")
    if kind == "qkv_proj":
        q = config.num_attention_heads * head_dim_of(config)
        kv = num_kv_heads_of(config) * head_dim_of(config)
        sizes = [("q_proj", q), ("k_proj", kv), ("v_proj", kv)]
    elif kind == "gate_up_proj":
        widths = ModelShape.of(config)
        width = widths.shared_expert_intermediate_size if parent.endswith(".shared_mlp") else \
            widths.intermediate_size
        sizes = [("gate_proj", width), ("up_proj", width)]
    else:
        return None
    parts, start = [], 0
    for part, rows in sizes:
        parts.append((f"{parent}.{part}.{attr}", start, start + rows))
        start += rows
    return parts


class RowWindow:
    """Rows [start, stop) of a fused tensor (a torch tensor, or a safetensors slice that reads
    only what is indexed), indexed as ShardPlan.shard indexes a checkpoint tensor. The parts
    are column-parallel, so row ranges are all a shard reads."""

    def __init__(self, rows: Any, start: int, stop: int):
        self.rows, self.start, self.stop = rows, start, stop

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.stop - self.start, *tuple(self.rows.shape)[1:])

    def __getitem__(self, key: Any) -> Any:
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        first, end, step = rows.indices(self.stop - self.start)
        if step != 1 or columns != slice(None):
            raise IndexError("a fused projection's part is read by row ranges only")
        return self.rows[self.start + first:self.start + max(first, end)]


# GraniteMoE's tensors, by the last two parts of their module name.
GRANITE_EXPERTS_IN, GRANITE_EXPERTS_OUT = "block_sparse_moe.input_linear", \
    "block_sparse_moe.output_linear"
GRANITE_ROUTER = "block_sparse_moe.router.layer.weight"
# The same tensors as transformers 5 names them, in the same layout (GraniteMoeSWA's
# checkpoints, which have no older names): read under the older ones.
GRANITE_NEWER_NAMES = {"block_sparse_moe.experts.gate_up_proj": f"{GRANITE_EXPERTS_IN}.weight",
                       "block_sparse_moe.experts.down_proj": f"{GRANITE_EXPERTS_OUT}.weight",
                       "block_sparse_moe.router.weight": GRANITE_ROUTER}
GRANITE_MOE_TYPES = ("granitemoe", "granitemoeshared", "granitemoehybrid", "granitemoe_swa")


# GLM-4's four norms per layer, under the names of Gemma 2's, which they are in order.
GLM4_NORMS = {"post_self_attn_layernorm": "post_attention_layernorm",
              "post_attention_layernorm": "pre_feedforward_layernorm",
              "post_mlp_layernorm": "post_feedforward_layernorm"}


# Gemma 4's expert block, kept on the layer, read under its `moe` (models/gemma4.py).
GEMMA4_EXPERT_BLOCK = ("router.", "experts.", "pre_feedforward_layernorm_2.",
                       "post_feedforward_layernorm_2.")


# LFM2's, Persimmon's, Phi's and StableLM's q and k norms over each head.
QK_LAYERNORMS = {".self_attn.q_layernorm.": ".self_attn.q_norm.",
                 ".self_attn.k_layernorm.": ".self_attn.k_norm."}

# Parts of a checkpoint name a family spells its own way, by model type, and ours: Hunyuan's
# q and k norms under Qwen3's names; StarCoder 2's MLP without a gate under Arcee's; Bamba's
# MLP, the norm before it and the final norm, and Llama 4's dense layers' MLP (its sparse
# blocks keep feed_forward), under Llama's; Nemotron-H's backbone under model, its embeddings
# and final norm under Llama's names; LFM2's norms, MLP and attention's under Llama's and
# Qwen3's.
RENAMED_PARTS = {
    "hunyuan_v1_dense": {".self_attn.query_layernorm.": ".self_attn.q_norm.",
                         ".self_attn.key_layernorm.": ".self_attn.k_norm."},
    "starcoder2": {".mlp.c_fc.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."},
    "bamba": {".feed_forward.": ".mlp.", ".pre_ff_layernorm.": ".post_attention_layernorm.",
              "model.final_layernorm.": "model.norm."},
    "llama4_text": {f".feed_forward.{part}.": f".mlp.{part}."
                    for part in ("gate_proj", "up_proj", "down_proj")},
    "nemotron_h": {"backbone.embeddings.": "model.embed_tokens.",
                   "backbone.norm_f.": "model.norm.", "backbone.layers.": "model.layers."},
    "lfm2": {".operator_norm.": ".input_layernorm.", ".ffn_norm.": ".post_attention_layernorm.",
             ".feed_forward.w1.": ".mlp.gate_proj.", ".feed_forward.w3.": ".mlp.up_proj.",
             ".feed_forward.w2.": ".mlp.down_proj.", ".self_attn.out_proj.": ".self_attn.o_proj.",
             **QK_LAYERNORMS, "model.embedding_norm.": "model.norm."}}
# LFM3: LFM2's names, with a norm before and after each branch, attention's Qwen3's but for its
# output gate, one row per head (gate_proj as saved, g_proj in transformers' model).
RENAMED_PARTS["lfm3"] = {".operator_norm.": ".input_layernorm.",
                         ".post_operator_norm.": ".post_attention_layernorm.",
                         ".ffn_norm.": ".pre_feedforward_layernorm.",
                         ".post_ffn_norm.": ".post_feedforward_layernorm.",
                         **{stored: ours for stored, ours in RENAMED_PARTS["lfm2"].items()
                            if stored.startswith(".feed_forward.")},
                         ".self_attn.gate_proj.": ".self_attn.head_gate_proj.",
                         ".self_attn.g_proj.": ".self_attn.head_gate_proj.",
                         "model.embedding_norm.": "model.norm."}
# OLMo Hybrid's checkpoints name the norm before each layer's token mixer and the one after
# it (before the MLP, or after attention in its attention layers) their own way.
RENAMED_PARTS["olmo_hybrid"] = {".attention_layer_norm.": ".input_layernorm.",
                                ".feedforward_layer_norm.": ".post_attention_layernorm."}
# LFM2's mixtures of experts: its dense layers', norms' and attention's names as LFM2's, the
# routing bias beside the router read into it.
RENAMED_PARTS["lfm2_moe"] = {**RENAMED_PARTS["lfm2"], ".feed_forward.expert_bias": (
    ".feed_forward.gate.e_score_correction_bias")}
# Hunyuan-A13B: the dense model's norms, its router's projection (wg) as the router itself.
RENAMED_PARTS["hunyuan_v1_moe"] = {**RENAMED_PARTS["hunyuan_v1_dense"],
                                   ".mlp.gate.wg.": ".mlp.gate."}
# Mamba-2's, Mamba's and Falcon Mamba's backbones are named as Nemotron-H's; Falcon-H1's and
# Jamba's MLP and norms as Bamba's; Apertus's norms and VaultGemma's second under Llama's names.
RENAMED_PARTS["mamba2"] = RENAMED_PARTS["mamba"] = RENAMED_PARTS["falcon_mamba"] = \
    RENAMED_PARTS["nemotron_h"]
RENAMED_PARTS["falcon_h1"] = RENAMED_PARTS["jamba"] = RENAMED_PARTS["bamba"]
RENAMED_PARTS["apertus"] = {".attention_layernorm.": ".input_layernorm.",
                            ".feedforward_layernorm.": ".post_attention_layernorm."}
# Kimi Linear: its experts (and its dense layers' MLP, as transformers saves it) under
# block_sparse_moe, each expert's w1, w3 and w2, read under DeepSeek-V3's names.
RENAMED_PARTS["kimi_linear"] = {".block_sparse_moe.": ".mlp.", ".w1.": ".gate_proj.",
                                ".w3.": ".up_proj.", ".w2.": ".down_proj."}
# HyperCLOVA X: its norms after each branch (post_norm1, post_norm2) and before the MLP
# (post_attention_layernorm) under Gemma's sandwich names, renamed in this order.
RENAMED_PARTS["hyperclovax"] = {".post_attention_layernorm.": ".pre_feedforward_layernorm.",
                                ".post_norm1.": ".post_attention_layernorm.",
                                ".post_norm2.": ".post_feedforward_layernorm."}
# AFMoE and Hunyuan 3: their router and expert bias under DeepSeek-V3's names (Hunyuan 3's
# shared MLP too); AFMoE's norms around the MLP under Gemma's sandwich names.
ROUTER_NAMES = {".mlp.router.gate.": ".mlp.gate.",
                ".mlp.expert_bias": ".mlp.gate.e_score_correction_bias"}
RENAMED_PARTS["hy_v3"] = {**ROUTER_NAMES, ".mlp.shared_mlp.": ".mlp.shared_experts."}
RENAMED_PARTS["afmoe"] = {**ROUTER_NAMES,
                          ".pre_mlp_layernorm.": ".pre_feedforward_layernorm.",
                          ".post_mlp_layernorm.": ".post_feedforward_layernorm."}
RENAMED_PARTS["mimo_v2_flash"] = {".self_attn.attention_sink_bias": ".self_attn.sinks"}
RENAMED_PARTS["flint"] = {".self_attn.softmax_offset": ".self_attn.sinks"}
# Kolibri: its norm before the MLP is named as Llama's after attention, so that one is renamed
# first; then the norms after each branch (as published, or as transformers names them), and
# the router's bias.
RENAMED_PARTS["kolibri1"] = {".post_attention_layernorm.": ".pre_feedforward_layernorm.",
                             ".post_attn_norm.": ".post_attention_layernorm.",
                             ".post_self_attn_layernorm.": ".post_attention_layernorm.",
                             ".post_ffn_norm.": ".post_feedforward_layernorm.",
                             ".post_mlp_layernorm.": ".post_feedforward_layernorm.",
                             ".moe.router.expert_bias": ".mlp.gate.e_score_correction_bias"}
# Sarvam-30B: Bailing's names (q, k and v one after the other in query_key_value: qkv_proj),
# its routing's correction bias named expert_bias.
RENAMED_PARTS["sarvam_moe"] = {"model.word_embeddings.": "model.embed_tokens.",
                               ".attention.query_key_value.": ".self_attn.qkv_proj.",
                               ".attention.dense.": ".self_attn.o_proj.",
                               ".attention.query_layernorm.": ".self_attn.q_norm.",
                               ".attention.key_layernorm.": ".self_attn.k_norm.",
                               ".mlp.gate.expert_bias": ".mlp.gate.e_score_correction_bias"}
# A.X K1: its sparse blocks' output norm, stored beside the block (loader.unread_tensor skips
# the dense layers' copies).
RENAMED_PARTS["axk1"] = {".post_mlp_layernorm.": ".mlp.post_mlp_layernorm."}
# Laguna: its routing's correction bias, stored beside the experts.
RENAMED_PARTS["laguna"] = {".mlp.experts.e_score_correction_bias":
                           ".mlp.gate.e_score_correction_bias"}
RENAMED_PARTS["vaultgemma"] = {".pre_feedforward_layernorm.": ".post_attention_layernorm."}
# EXAONE 3 and 3.5: Llama's layers under GPT-2's names.
RENAMED_PARTS["exaone"] = {"transformer.wte.": "model.embed_tokens.", "transformer.h.":
                           "model.layers.", "transformer.ln_f.": "model.norm.",
                           ".attn.attention.out_proj.": ".self_attn.o_proj.",
                           ".attn.attention.": ".self_attn.", ".ln_1.": ".input_layernorm.",
                           ".ln_2.": ".post_attention_layernorm.", ".mlp.c_fc_0.":
                           ".mlp.gate_proj.", ".mlp.c_fc_1.": ".mlp.up_proj.",
                           ".mlp.c_proj.": ".mlp.down_proj."}
# GPT-NeoX: its embeddings, layers, norms and projections under Llama's names (q, k and v
# stay fused per head in query_key_value: _per_head_qkv_parts).
RENAMED_PARTS["gpt_neox"] = {"gpt_neox.embed_in.": "model.embed_tokens.",
                             "gpt_neox.layers.": "model.layers.",
                             "gpt_neox.final_layer_norm.": "model.norm.",
                             "embed_out.": "lm_head.", ".attention.dense.": ".self_attn.o_proj.",
                             ".attention.query_key_value.": ".self_attn.query_key_value.",
                             ".mlp.dense_h_to_4h.": ".mlp.up_proj.",
                             ".mlp.dense_4h_to_h.": ".mlp.down_proj."}
# GPT-2 and GPT-BigCode: their embeddings, norms and projections under Llama's names; q, k and
# v fused one after the other (qkv_proj), but per head in GPT-BigCode's without multi_query.
RENAMED_PARTS["gpt2"] = {"transformer.wte.": "model.embed_tokens.",
                         "transformer.wpe.": "model.embed_positions.",
                         "transformer.h.": "model.layers.", "transformer.ln_f.": "model.norm.",
                         ".ln_1.": ".input_layernorm.", ".ln_2.": ".post_attention_layernorm.",
                         ".attn.c_attn.": ".self_attn.qkv_proj.",
                         ".attn.c_proj.": ".self_attn.o_proj.", ".mlp.c_fc.": ".mlp.up_proj.",
                         ".mlp.c_proj.": ".mlp.down_proj."}
RENAMED_PARTS["gpt_bigcode"] = RENAMED_PARTS["gpt2"]
# GPT-J: GPT-2's names but for q, k and v apart, its output projection and MLP.
RENAMED_PARTS["gptj"] = {"transformer.wte.": "model.embed_tokens.",
                         "transformer.h.": "model.layers.", "transformer.ln_f.": "model.norm.",
                         ".ln_1.": ".input_layernorm.", ".attn.out_proj.": ".self_attn.o_proj.",
                         ".attn.": ".self_attn.", ".mlp.fc_in.": ".mlp.up_proj.",
                         ".mlp.fc_out.": ".mlp.down_proj."}
# GPT-Neo: GPT-2's names but for attention's, q, k and v apart under attn.attention.
RENAMED_PARTS["gpt_neo"] = {**{stored: ours for stored, ours in RENAMED_PARTS["gpt2"].items()
                               if ".attn." not in stored},
                            ".attn.attention.out_proj.": ".self_attn.o_proj.",
                            ".attn.attention.": ".self_attn."}
# CodeGen: GPT-J's names, q, k and v fused as its four training shards held them, under a
# name of its own (_codegen_qkv_parts; the qkv_proj others fuse in order is fused_parts').
CODEGEN_QKV = "self_attn.codegen_qkv_proj"
CODEGEN_SHARDS = 4
RENAMED_PARTS["codegen"] = {**RENAMED_PARTS["gptj"], ".self_attn.qkv_proj.": f".{CODEGEN_QKV}."}
# OPT: its decoder's embeddings, layers and norms under Llama's names (its checkpoints name the
# decoder with or without model. before it).
RENAMED_PARTS["opt"] = {"model.decoder.": "model.", "decoder.": "model.",
                        ".self_attn_layer_norm.": ".input_layernorm.",
                        "model.final_layer_norm.": "model.norm.",
                        ".final_layer_norm.": ".post_attention_layernorm.",
                        ".self_attn.out_proj.": ".self_attn.o_proj.",
                        ".fc1.": ".mlp.up_proj.", ".fc2.": ".mlp.down_proj."}
# XGLM: OPT's names (without its decoder's prefix), its final norm named layer_norm.
RENAMED_PARTS["xglm"] = {**RENAMED_PARTS["opt"], "model.layer_norm.": "model.norm."}
# Falcon: its embeddings, layers, norms and projections under Llama's names (q, k and v stay
# fused per KV head in query_key_value: _per_head_qkv_parts).
RENAMED_PARTS["falcon"] = {"transformer.word_embeddings.": "model.embed_tokens.",
                           "transformer.h.": "model.layers.", "transformer.ln_f.": "model.norm.",
                           ".self_attention.dense.": ".self_attn.o_proj.",
                           ".self_attention.query_key_value.": ".self_attn.query_key_value.",
                           ".ln_attn.": ".input_layernorm.",
                           ".ln_mlp.": ".post_attention_layernorm.",
                           ".mlp.dense_h_to_4h.": ".mlp.up_proj.",
                           ".mlp.dense_4h_to_h.": ".mlp.down_proj."}
# Persimmon: GPT-NeoX's MLP and its q, k and v fused per head, already under self_attn
# (_per_head_qkv_parts), its norms under their own names.
RENAMED_PARTS["persimmon"] = {".self_attn.dense.": ".self_attn.o_proj.", **QK_LAYERNORMS,
                              ".mlp.dense_h_to_4h.": ".mlp.up_proj.",
                              ".mlp.dense_4h_to_h.": ".mlp.down_proj.",
                              "model.final_layernorm.": "model.norm."}
# BLOOM: Falcon's names, with its embeddings' norm.
RENAMED_PARTS["bloom"] = {**RENAMED_PARTS["falcon"],
                          "transformer.word_embeddings_layernorm.": "model.embed_norm."}
# MPT: its embeddings, blocks, norms and projections under Llama's names (Wqkv holds q, k and
# v one after the other: qkv_proj).
RENAMED_PARTS["mpt"] = {"transformer.wte.": "model.embed_tokens.",
                        "transformer.blocks.": "model.layers.",
                        "transformer.norm_f.": "model.norm.", ".norm_1.": ".input_layernorm.",
                        ".norm_2.": ".post_attention_layernorm.",
                        ".attn.Wqkv.": ".self_attn.qkv_proj.",
                        ".attn.out_proj.": ".self_attn.o_proj.", ".ffn.": ".mlp."}
# DBRX: MPT's names under norm_attn_norm, its router as Mixtral's (the experts are read by
# _dbrx_expert_parts).
RENAMED_PARTS["dbrx"] = {"transformer.wte.": "model.embed_tokens.",
                         "transformer.blocks.": "model.layers.",
                         "transformer.norm_f.": "model.norm.",
                         ".norm_attn_norm.norm_1.": ".input_layernorm.",
                         ".norm_attn_norm.norm_2.": ".post_attention_layernorm.",
                         ".norm_attn_norm.attn.Wqkv.": ".self_attn.qkv_proj.",
                         ".norm_attn_norm.attn.out_proj.": ".self_attn.o_proj.",
                         ".ffn.router.layer.": ".block_sparse_moe.gate."}
# Phi-2: its output projection (dense) and MLP (fc1, fc2) under Llama's names.
RENAMED_PARTS["nanochat"] = {".mlp.fc1.": ".mlp.up_proj.", ".mlp.fc2.": ".mlp.down_proj."}
RENAMED_PARTS["phi"] = {".self_attn.dense.": ".self_attn.o_proj.", ".mlp.fc1.": ".mlp.up_proj.",
                        ".mlp.fc2.": ".mlp.down_proj.", "model.final_layernorm.": "model.norm.",
                        **QK_LAYERNORMS}
# StableLM 2 12B: a norm per head under q_layernorm.norms.{h} (layers/norm.py: HeadLayerNorms).
RENAMED_PARTS["stablelm"] = QK_LAYERNORMS


# MiniMax-M2, ERNIE 4.5 and K-EXAONE keep their routing's correction bias beside the router,
# not in it.
BLOCK_CORRECTION_BIAS = "block_sparse_moe.e_score_correction_bias"
ERNIE_CORRECTION_BIAS = "mlp.moe_statics.e_score_correction_bias"
MLP_CORRECTION_BIAS = "mlp.e_score_correction_bias"


def renamed(config: Any, name: str) -> str:
    """A checkpoint name under the model's own, where they differ (GraniteMoE's router,
    GLM-4's norms, MiniMax-M2's and K-EXAONE's correction bias, StarCoder 2's MLP, Hunyuan's q and k
    norms, Llama 4's dense MLP under feed_forward, Bamba's MLP and norms)."""
    if getattr(config, "model_type", None) in GRANITE_MOE_TYPES:
        for newer, older in GRANITE_NEWER_NAMES.items():
            if name.endswith(newer):
                name = name[:-len(newer)] + older
    if name.endswith(GRANITE_ROUTER):
        return name[:-len(GRANITE_ROUTER)] + "block_sparse_moe.gate.weight"
    if name.endswith(BLOCK_CORRECTION_BIAS):
        return name[:-len(BLOCK_CORRECTION_BIAS)] + "block_sparse_moe.gate.e_score_correction_bias"
    if name.endswith(ERNIE_CORRECTION_BIAS):
        return name[:-len(ERNIE_CORRECTION_BIAS)] + "mlp.gate.e_score_correction_bias"
    if name.endswith(MLP_CORRECTION_BIAS):
        return name[:-len(MLP_CORRECTION_BIAS)] + "mlp.gate.e_score_correction_bias"
    if getattr(config, "model_type", None) == "gemma4_text":
        layer, sep, rest = name.partition(".layers.")
        index, _, part = rest.partition(".")
        if sep and part.startswith(GEMMA4_EXPERT_BLOCK):
            return f"{layer}.layers.{index}.moe.{part}"
    if getattr(config, "model_type", None) in GRANITE_SHARED_MLP and ".shared_mlp." in name:
        return _granite_shared_mlp(config, name)
    if getattr(config, "model_type", None) in ("gpt2", "bloom") and \
            not name.startswith(("transformer.", "lm_head.")):
        name = f"transformer.{name}"  # GPT-2's and BLOOM's first checkpoints: bare names
    for stored, ours in RENAMED_PARTS.get(getattr(config, "model_type", None), {}).items():
        name = name.replace(stored, ours)
    if getattr(config, "model_type", None) == "gpt_bigcode" and \
            not getattr(config, "multi_query", True):
        name = name.replace(".self_attn.qkv_proj.", f".{PER_HEAD_QKV}.")
    if getattr(config, "model_type", None) == LAGUNA:  # its output gate, per number or head
        kind = "gate_proj" if output_gate_of(config) == "element" else "head_gate_proj"
        name = name.replace(".self_attn.g_proj.", f".self_attn.{kind}.")
    if getattr(config, "model_type", None) == "glm4":
        module, _, attr = name.rpartition(".")
        parent, _, kind = module.rpartition(".")
        if kind in GLM4_NORMS:
            return f"{parent}.{GLM4_NORMS[kind]}.{attr}"
    return name


# Granite 4.0-H's shared MLP (shared_mlp: input_linear holds gate then up, output_linear is
# down): the shared expert of its experts' block, or the layer's MLP where it has none.
GRANITE_HYBRID = "granitemoehybrid"
# The model types whose shared MLP is stored so: Granite 4.0-H's and GraniteMoeShared's.
GRANITE_SHARED_MLP = (GRANITE_HYBRID, "granitemoeshared", "granitemoe_swa")


def _granite_shared_mlp(config: Any, name: str) -> str:
    block = "block_sparse_moe.shared_mlp" if num_experts_of(config) else "mlp"
    name = name.replace(".shared_mlp.input_linear.", f".{block}.gate_up_proj.")
    return name.replace(".shared_mlp.output_linear.", f".{block}.down_proj.")


Take = Callable[[torch.Tensor], torch.Tensor]


def expert_parts(config: Any, name: str) -> list[tuple[str, Take]] | None:
    """(part name, what of the stored tensor it takes) of each expert's part of a tensor that
    holds a layer's experts (GraniteMoE's, GPT-OSS's), or of each projection's part of one
    that holds several in an order of their rows (Qwen3-Next's, GPT-NeoX's), or None for any
    other tensor."""
    module, _, attr = name.rpartition(".")
    if module.endswith(GRANITE_EXPERTS_IN):
        parent = module[:-len(GRANITE_EXPERTS_IN)] + "block_sparse_moe.experts"
        width = config.intermediate_size
        return [part for e in range(config.num_local_experts) for part in (
            (f"{parent}.{e}.gate_proj.{attr}", lambda w, e=e: w[e, :width]),
            (f"{parent}.{e}.up_proj.{attr}", lambda w, e=e: w[e, width:2 * width]))]
    if module.endswith(GRANITE_EXPERTS_OUT):
        parent = module[:-len(GRANITE_EXPERTS_OUT)] + "block_sparse_moe.experts"
        return [(f"{parent}.{e}.down_proj.{attr}", lambda w, e=e: w[e])
                for e in range(config.num_local_experts)]
    if module.endswith(STACKED_EXPERTS) and attr in QWEN_PARTS and \
            getattr(config, "model_type", None) in STACKED_EXPERT_TYPES:
        return _stacked_parts(config, name)
    if module.endswith(GPT_OSS_EXPERTS) and attr in GPT_OSS_PARTS:
        return _gpt_oss_parts(name, config.num_local_experts)
    if module.endswith(QWEN3_NEXT_FUSED):
        return _qwen3_next_parts(config, module)
    if module.endswith(PER_HEAD_QKV):
        return _per_head_qkv_parts(config, module, attr)
    if module.endswith(CODEGEN_QKV):
        return _codegen_qkv_parts(config, module)
    if module.endswith(DBRX_EXPERTS) and attr in DBRX_PARTS:
        return _dbrx_expert_parts(config, module, attr)
    return None


# DBRX keeps a layer's experts in three tensors under ffn.experts.mlp, each [experts * width,
# hidden]: w1 the gates', v1 the ups', w2 the downs' (transposed).
DBRX_EXPERTS = "ffn.experts.mlp"
DBRX_PARTS = {"w1": "w1", "v1": "w3", "w2": "w2"}


def _dbrx_expert_parts(config: Any, module: str, attr: str) -> list[tuple[str, Take]]:
    parent = module[:-len(DBRX_EXPERTS)] + "block_sparse_moe.experts"
    experts, width = config.num_local_experts, config.intermediate_size

    def expert(w: torch.Tensor, e: int) -> torch.Tensor:
        rows = w.reshape(experts, width, w.shape[-1])[e]
        return rows.t() if attr == "w2" else rows

    return [(f"{parent}.{e}.{DBRX_PARTS[attr]}.weight", lambda w, e=e: expert(w, e))
            for e in range(experts)]


# GPT-2's projections are Conv1D weights, stored [in, out]: read transposed.
CONV1D_WEIGHTS = (".self_attn.qkv_proj.weight", ".self_attn.o_proj.weight",
                  ".mlp.up_proj.weight", ".mlp.down_proj.weight")


def stored_transposed(config: Any, name: str) -> bool:
    """Whether checkpoint tensor `name` (under the model's names) is stored as [in, out]."""
    return getattr(config, "model_type", None) == "gpt2" and name.endswith(CONV1D_WEIGHTS)


# GPT-NeoX, Falcon and GPT-BigCode without multi_query keep q, k and v in one tensor per
# layer, KV head by KV head: the rows of the query heads it serves, its key rows, then its
# value rows ([KV heads, queries per KV head + 2, head size, hidden]; GPT-NeoX's a query
# head per KV head, Falcon 7B's one KV head for all).
PER_HEAD_QKV = "self_attn.query_key_value"


def _per_head_qkv_parts(config: Any, module: str, attr: str) -> list[tuple[str, Take]]:
    groups, size = num_kv_heads_of(config), head_dim_of(config)
    queries = config.num_attention_heads // groups
    parent = module.rpartition(".")[0]

    def part(w: torch.Tensor, first: int, count: int) -> torch.Tensor:
        rows = w.reshape(groups, queries + 2, size, *w.shape[1:])[:, first:first + count]
        return rows.reshape(groups * count * size, *w.shape[1:])

    return [(f"{parent}.q_proj.{attr}", lambda w: part(w, 0, queries)),
            (f"{parent}.k_proj.{attr}", lambda w: part(w, queries, 1)),
            (f"{parent}.v_proj.{attr}", lambda w: part(w, queries + 1, 1))]


def _codegen_qkv_parts(config: Any, module: str) -> list[tuple[str, Take]]:
    """CodeGen's qkv_proj: four blocks of rows, one per shard of its training, each holding
    that shard's quarter of q's rows, then of v's, then of k's."""
    parent = module.rpartition(".")[0]

    def part(w: torch.Tensor, index: int) -> torch.Tensor:
        shards = w.reshape(CODEGEN_SHARDS, 3, -1, w.shape[-1])
        return shards[:, index].reshape(-1, w.shape[-1])

    return [(f"{parent}.q_proj.weight", lambda w: part(w, 0)),
            (f"{parent}.v_proj.weight", lambda w: part(w, 1)),
            (f"{parent}.k_proj.weight", lambda w: part(w, 2))]


# Qwen3-Next keeps a gated delta net's input projections in two tensors, grouped by key
# head: in_proj_qkvz holds, for each key head, its query and key rows, then the value and
# gate (z) rows of the value heads it serves; in_proj_ba their b rows, then their a rows.
# Qwen3.5 stores each kind whole (in_proj_qkv: every query head, every key head, every
# value head; in_proj_z, in_proj_b, in_proj_a), which the model's merged projection holds.
QWEN3_NEXT_FUSED = ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba")


def _qwen3_next_parts(config: Any, module: str) -> list[tuple[str, Take]]:
    shape = linear_attention_of(config)
    groups, per_group = shape.num_k_heads, shape.num_v_heads // shape.num_k_heads
    parent = module.rpartition(".")[0]

    def grouped(w: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
        """Each kind's rows of every group, in group order: [rows of the kind, in]."""
        kinds = w.reshape(groups, sum(sizes), -1).split(sizes, dim=1)
        return tuple(kind.reshape(-1, w.shape[-1]) for kind in kinds)

    if module.endswith("in_proj_ba"):
        return [(f"{parent}.in_proj_b.weight", lambda w: grouped(w, [per_group] * 2)[0]),
                (f"{parent}.in_proj_a.weight", lambda w: grouped(w, [per_group] * 2)[1])]
    sizes = [shape.key_dim, shape.key_dim, per_group * shape.value_dim,
             per_group * shape.value_dim]
    return [(f"{parent}.in_proj_qkv.weight", lambda w: torch.cat(grouped(w, sizes)[:3])),
            (f"{parent}.in_proj_z.weight", lambda w: grouped(w, sizes)[3])]


# Qwen3-VL-MoE keeps a layer's experts in two tensors under mlp.experts: gate then up, and
# down, each [experts, in, out] as first published, [experts, out, in] as transformers 5
# saves them; Mistral 4's and Gemma 4's checkpoints, published by transformers 5, in its
# layout (Gemma 4's on the layer, read under its `moe`).
STACKED_EXPERTS = ("mlp.experts", "moe.experts", "feed_forward.experts")
QWEN_PARTS = ("gate_up_proj", "down_proj")
# Llama 4 keeps them [experts, in, out] whichever transformers wrote them.
LLAMA4 = "llama4_text"
STACKED_EXPERT_TYPES = (QWEN3_VL_MOE, QWEN3_5_MOE, "mistral4", "gemma4_text", LLAMA4)


def _saved_by_transformers_5(config: Any) -> bool:
    outer = getattr(config, "multimodal_config", config)
    major = str(getattr(outer, "transformers_version", "") or "").split(".")[0]
    return major.isdigit() and int(major) >= 5


def _stacked_parts(config: Any, name: str) -> list[tuple[str, Take]]:
    parent, _, attr = name.rpartition(".")
    width, hidden = ModelShape.of(config).expert_intermediate_size, config.hidden_size
    experts = num_experts_of(config)
    newer = _saved_by_transformers_5(config) and config.model_type != LLAMA4

    def rows(w: torch.Tensor, out: int) -> torch.Tensor:
        """[experts, out, in] whichever way the checkpoint stores it (a square shape: by the
        transformers version that saved it)."""
        stored_out = w.shape[1] == out and (w.shape[2] != out or newer)
        return w if stored_out else w.transpose(1, 2)

    if attr == "down_proj":
        return [(f"{parent}.{e}.down_proj.weight", lambda w, e=e: rows(w, hidden)[e])
                for e in range(experts)]
    return [part for e in range(experts) for part in (
        (f"{parent}.{e}.gate_proj.weight", lambda w, e=e: rows(w, 2 * width)[e, :width]),
        (f"{parent}.{e}.up_proj.weight", lambda w, e=e: rows(w, 2 * width)[e, width:]))]


# GPT-OSS keeps a layer's experts in four tensors under mlp.experts: gate and up interleaved
# (column 2i is gate's row i, 2i+1 up's), stored as [experts, in, out], their biases, and down.
GPT_OSS_EXPERTS = "mlp.experts"
GPT_OSS_PARTS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def _gpt_oss_parts(name: str, experts: int) -> list[tuple[str, Take]]:
    parent, _, attr = name.rpartition(".")
    kind = "bias" if attr.endswith("_bias") else "weight"
    if attr.startswith("down_proj"):
        take = (lambda w, e: w[e].t()) if kind == "weight" else (lambda w, e: w[e])
        return [(f"{parent}.{e}.down_proj.{kind}", lambda w, e=e: take(w, e))
                for e in range(experts)]
    if kind == "weight":
        gate, up = (lambda w, e: w[e, :, 0::2].t()), (lambda w, e: w[e, :, 1::2].t())
    else:
        gate, up = (lambda w, e: w[e, 0::2]), (lambda w, e: w[e, 1::2])
    return [part for e in range(experts) for part in (
        (f"{parent}.{e}.gate_proj.{kind}", lambda w, e=e: gate(w, e)),
        (f"{parent}.{e}.up_proj.{kind}", lambda w, e=e: up(w, e)))]
