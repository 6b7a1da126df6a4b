"""Which transformers architectures we run, and the few ways they differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmill.engine.contract.model_shape import ModelShape, kimi_linear, num_experts_of
from tokenmill.engine.contract.pooling import Classifier
from tokenmill.engine.layers.activation import ACTIVATIONS, UNGATED_ACTIVATIONS
from tokenmill.engine.layers.rotary import LAYER_TYPES, layer_type_theta, rope_parameters
from tokenmill.engine.models.source import ModelLoadError


@dataclass(frozen=True)
class ArchitectureFlags:
    qkv_bias: bool = False       # Qwen2: bias on q/k/v projections only
    # Phi-2: a bias on every projection, the LM head's too, and attention and the MLP in
    # parallel off one norm (Cohere's layer, without Cohere's norm and rotary).
    phi: bool = False
    qk_norm: bool = False        # Qwen3: RMSNorm over each head of q and k before rotary
    qk_norm_after_rope: bool = False  # Hunyuan: that norm after the rotary turn
    moe: str | None = None       # mixture-of-experts naming: "qwen" or "mixtral" (MOE_NAMES)
    # Gemma: norms scale by 1 + weight, embeddings are multiplied by sqrt(hidden_size), the
    # MLP's activation is GeLU (tanh), and the attention scale may come from
    # query_pre_attn_scalar; soft caps and sliding layers are read from the config.
    gemma: bool = False
    sandwich_norms: bool = False  # Gemma 2/3: a norm after attention and after the MLP too
    # Granite: embeddings times embedding_multiplier, attention scaled by attention_multiplier,
    # each branch's output times residual_multiplier as it joins the stream, logits divided
    # by logits_scaling.
    granite: bool = False
    # OLMo 2/3: no norm before attention or the MLP, one after each (on the branch's output,
    # before it joins the stream).
    olmo: bool = False
    # OLMo 2/3 and OLMoE: q and k normalized over the whole projection, not per head.
    projection_qk_norm: bool = False
    # EXAONE 4: where the model slides, its full-attention layers have no positional encoding.
    full_layers_nope: bool = False
    # ERNIE 4.5: rotary pairs are adjacent dimensions (2i, 2i+1), not the two halves of a head;
    # q and k rows are reordered to halves at load, which turns the same (loader.py).
    interleaved_rope: bool = False
    # GLM-4: attention_bias covers q, k and v only, never the output projection.
    bias_on_qkv_only: bool = False
    # Arcee: an MLP without a gate (up_proj, the activation, down_proj).
    ungated_mlp: bool = False
    # GPT-OSS: a learned logit per attention head joins every softmax (attention sinks).
    attention_sinks: bool = False
    # NanoChat: every RMSNorm without a weight, one over the embeddings too; q and k
    # normalized so after the rotary turn, which turns the other way (its rotate_half is
    # (x2, -x1)); logits soft-capped (final_logit_softcapping).
    nanochat: bool = False
    # DeepSeek-V2/V3: multi-head latent attention (models/latent_attention.py).
    latent_attention: bool = False
    # Arcee's AFMoE (Trinity): attention's output times the sigmoid of a gate projected from
    # the layer's input (gate_proj, one per head and channel).
    output_gate: bool = False
    # HyperCLOVA X: Granite's multipliers but logits times logits_scaling, and a norm after
    # each branch (Gemma's sandwich) where use_post_norm (sandwich_norms_of).
    logits_times_scaling: bool = False
    # Gemma 3n: AltUp's streams for the residual stream, LAuReL, sparse activations
    # (models/gemma3n.py) around Gemma 4's attention.
    gemma3n: bool = False
    # MiMo-V2-Flash: values narrower than keys (v_head_dim; the cache pads them to a key's
    # width) and scaled by attention_value_scale; its sliding layers have twice the KV heads
    # (contract/model_shape.py) and attention sinks, its full layers neither.
    mimo_v2: bool = False
    # GLM-5: its sparse attention's indexer turns adjacent rotary pairs, as its latent
    # attention does (DeepSeek-V3.2's indexer turns two halves).
    indexer_rope_interleaved: bool = False
    # Cohere: LayerNorm (layers/norm.py) for RMSNorm, attention and the MLP in parallel off one
    # norm per layer, logits times logit_scale.
    cohere: bool = False
    # StarCoder 2: torch's LayerNorm, with a bias, for RMSNorm.
    layer_norm: bool = False
    # Gemma 4: embeddings times sqrt(hidden_size) but norms that scale by their weight (not
    # 1 + weight); its full-attention layers' own head size and KV heads (per_layer_config),
    # their values the keys' projection (attention_k_eq_v); q, k and v normalized per head (v
    # without a weight), scores unscaled; each layer's output times a learned scalar.
    gemma4: bool = False
    # Qwen3.5 and Qwen3-Next: norms scale by 1 + weight, as Gemma's (and nothing else of
    # Gemma's).
    unit_offset_norms: bool = False
    # Llama 4: q and k normalized (no weight) after the rotary turn where use_qk_norm, the
    # rotating layers attending within chunks of attention_chunk_size, the others (no
    # positional encoding) scaling queries by position (attn_temperature_tuning).
    llama4: bool = False
    # Nemotron-H: each layer is one block, a norm and one mixer (a Mamba-2 layer, attention
    # without positional encoding, an MLP or experts), as its layer_types list them
    # (models/mixer_block.py).
    mixer_blocks: bool = False
    # Falcon-H1: attention and a Mamba-2 layer side by side in every layer, muP multipliers
    # (models/falcon_h1.py).
    falcon_h1: bool = False
    # GPT-NeoX: q, k and v stored fused per head (query_key_value), biases on the MLP too, and
    # attention and the MLP in parallel off a norm each where use_parallel_residual.
    gpt_neox: bool = False
    # GPT-2, GPT-BigCode and OPT: a learned embedding per position added to the token's (no
    # rotary), and their config's own names for the MLP's width and activation
    # (declare_family_names).
    learned_positions: bool = False
    # GPT-J: attention and the MLP in parallel off one norm (Phi-2's layer), biases on the MLP
    # and the LM head but not on attention.
    gptj: bool = False
    # Falcon: q, k and v fused per KV head (query_key_value), attention and the MLP in parallel
    # (off one norm, or ln_attn and ln_mlp) or in sequence, as parallel_norms_of reads it.
    falcon: bool = False
    # BLOOM and MPT: ALiBi instead of rotary (layers/alibi.py); BLOOM also normalizes its
    # embeddings.
    alibi: bool = False

    @property
    def norms_add_one(self) -> bool:
        """Whether RMSNorm weights are stored as offsets from 1."""
        return self.gemma or self.unit_offset_norms


SUPPORTED = {
    "LlamaForCausalLM": ArchitectureFlags(),
    "MistralForCausalLM": ArchitectureFlags(),
    # Ministral 8B (2410): Mistral with sliding and full layers listed in layer_types.
    "MinistralForCausalLM": ArchitectureFlags(),
    # Ministral 3 (3B-14B, 2512) and the language model of its multimodal checkpoints:
    # Mistral with YaRN and Llama 4's query scale by position (layers/rotary.py).
    "Ministral3ForCausalLM": ArchitectureFlags(),
    "Qwen2ForCausalLM": ArchitectureFlags(qkv_bias=True),
    "Qwen3ForCausalLM": ArchitectureFlags(qk_norm=True),
    "MixtralForCausalLM": ArchitectureFlags(moe="mixtral"),
    # Phi-3.5-MoE: Mixtral's experts under its names, LayerNorm with biases, biases on the
    # attention's projections and the LM head (attention_bias, lm_head_bias), and its
    # sparsemixer routing (layers/moe.py: route_sparsemixer).
    "PhimoeForCausalLM": ArchitectureFlags(layer_norm=True, moe="phimoe"),
    "Qwen2MoeForCausalLM": ArchitectureFlags(qkv_bias=True, moe="qwen"),
    "Qwen3MoeForCausalLM": ArchitectureFlags(qk_norm=True, moe="qwen"),
    # JetBrains' Mellum: Qwen3-MoE's layers, sliding ones among them (layer_types) with their own
    # rotary, the dense ones mlp_layer_types names; its prediction layers (mtp.) unread.
    "MellumForCausalLM": ArchitectureFlags(qk_norm=True, moe="qwen"),
    "GemmaForCausalLM": ArchitectureFlags(gemma=True),
    "Gemma2ForCausalLM": ArchitectureFlags(gemma=True, sandwich_norms=True),
    # Google's VaultGemma: Gemma 2 with Llama's two norms (its pre_feedforward_layernorm read
    # as the second).
    "VaultGemmaForCausalLM": ArchitectureFlags(gemma=True),
    "Gemma3ForCausalLM": ArchitectureFlags(gemma=True, sandwich_norms=True, qk_norm=True),
    "Gemma4ForCausalLM": ArchitectureFlags(gemma4=True, sandwich_norms=True, qk_norm=True),
    # Naver's HyperCLOVA X SEED: Granite's layers with a norm after each branch (post_norm1,
    # post_norm2: fused_weights.py reads them as Gemma's sandwich norms), logits multiplied.
    "HyperCLOVAXForCausalLM": ArchitectureFlags(granite=True, logits_times_scaling=True),
    # Gemma 3n (E2B, E4B): AltUp, LAuReL, per-layer inputs, shared KV, sparse activations.
    "Gemma3nForCausalLM": ArchitectureFlags(gemma3n=True, qk_norm=True),
    # Phi-3 and Phi-4: Llama's layers, stored fused (models/fused_weights.py).
    "Phi3ForCausalLM": ArchitectureFlags(),
    "GraniteForCausalLM": ArchitectureFlags(granite=True),
    # Granite's multipliers over a mixture of experts (stored fused, models/fused_weights.py).
    "GraniteMoeForCausalLM": ArchitectureFlags(granite=True, moe="granite"),
    # GraniteMoeShared: GraniteMoE's experts beside a shared MLP, stored as Granite 4.0-H's.
    "GraniteMoeSharedForCausalLM": ArchitectureFlags(granite=True, moe="granite_hybrid"),
    # Granite SWA (granite-swash): Granite's with sliding layers by layer_types, GPT-OSS's
    # attention sinks (transformers scales the output by sigmoid(logsumexp - sink): the same
    # extra softmax logit) and a rotary base per layer (layer_rope_theta, 0: none); over
    # GraniteMoeShared's experts as GraniteMoeSWA.
    "GraniteSWAForCausalLM": ArchitectureFlags(granite=True, attention_sinks=True),
    "GraniteMoeSWAForCausalLM": ArchitectureFlags(granite=True, moe="granite_hybrid",
                                                  attention_sinks=True),
    # Karpathy's NanoChat: Llama's layers with weightless norms, an ungated MLP of squared
    # ReLU stored as fc1 and fc2 (models/fused_weights.py), q and k normed after a backward
    # rotary turn.
    "NanoChatForCausalLM": ArchitectureFlags(nanochat=True, ungated_mlp=True),
    # SmolLM3: Llama's layers, every fourth without rotary embeddings (rotates_at).
    "SmolLM3ForCausalLM": ArchitectureFlags(),
    # GLM-4 (0414, Z1): Gemma 2's four norms per layer under GLM's names (fused_weights.py),
    # plain RMSNorm, rotary over interleaved pairs of a part of each head, fused gate_up_proj.
    "Glm4ForCausalLM": ArchitectureFlags(sandwich_norms=True, interleaved_rope=True,
                                         bias_on_qkv_only=True),
    # GLM-4 (glm-4-9b in transformers' layout): GLM-4-0414's layers with two norms, Llama's.
    "GlmForCausalLM": ArchitectureFlags(interleaved_rope=True, bias_on_qkv_only=True),
    # Swiss AI's Apertus: Llama's layers with q and k normalized per head (Qwen3's), an MLP
    # without a gate of xIELU (its parameters learned per layer).
    "ApertusForCausalLM": ArchitectureFlags(qk_norm=True, ungated_mlp=True),
    # Kyutai's Helium: Llama's layers, rotary over interleaved pairs, no bias on attention's
    # output projection.
    "HeliumForCausalLM": ArchitectureFlags(interleaved_rope=True, bias_on_qkv_only=True),
    # LG's EXAONE 3 and 3.5 (Llama's layers under GPT-2's names, fused_weights.py) and
    # Shanghai AI Lab's InternLM3: Llama's layers.
    "ExaoneForCausalLM": ArchitectureFlags(),
    "InternLM3ForCausalLM": ArchitectureFlags(),
    # IQuest's IQuest-Coder: Llama's layers.
    "IQuestCoderForCausalLM": ArchitectureFlags(),
    # Arcee (AFM): Llama's layers with an ungated MLP of squared ReLU.
    "ArceeForCausalLM": ArchitectureFlags(ungated_mlp=True),
    # Inception's Jais 2: Llama's layers with LayerNorm (biases), an ungated MLP of squared
    # ReLU, biases on every projection where attention_bias and mlp_bias.
    "Jais2ForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True),
    # Meta's Code World Model (CWM): Llama's layers, three sliding to a full one (layer_types).
    "CwmForCausalLM": ArchitectureFlags(),
    # ERNIE 4.5 (dense): Llama's layers, rotary over interleaved pairs, use_bias on every
    # projection where set.
    "Ernie4_5ForCausalLM": ArchitectureFlags(interleaved_rope=True),
    # Seed-OSS: Llama's layers with biases on q, k and v (attention_bias), not on the output
    # projection (attention_out_bias).
    "SeedOssForCausalLM": ArchitectureFlags(),
    # StarCoder 2: LayerNorm with biases, an MLP without a gate (c_fc, GeLU, c_proj) and biases
    # on every projection; it slides in every layer where sliding_window is set.
    "Starcoder2ForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True),
    # Stability AI's StableLM 2 and StableLM-3B-4E1T: LayerNorm, rotary over a quarter of each
    # head, biases on q, k and v where use_qkv_bias, attention and the MLP in parallel off one
    # norm where use_parallel_residual.
    "StableLmForCausalLM": ArchitectureFlags(layer_norm=True),
    # Microsoft's Phi-1.5 and Phi-2: LayerNorm, rotary over part of each head, an MLP of GeLU
    # without a gate (fc1, fc2), biases everywhere.
    "PhiForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True, phi=True),
    # EleutherAI's GPT-NeoX (Pythia, GPT-NeoX-20B, and the models trained with its code):
    # LayerNorm, rotary over part of each head, an MLP of GeLU without a gate, biases on every
    # projection, attention and the MLP side by side, each off its own norm.
    "GPTNeoXForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True, gpt_neox=True),
    # Adept's Persimmon-8B (and Fuyu's language model): LayerNorm with biases, q, k and v
    # fused per head as GPT-NeoX's, each head of q and k through a LayerNorm where
    # qk_layernorm, rotary over half of each head, an MLP of squared ReLU without a gate,
    # biases on every projection.
    "PersimmonForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True),
    # OpenAI's GPT-2 (its Conv1D weights stored [in, out], transposed at load), BigCode's
    # GPT-BigCode (StarCoder, SantaCoder: one KV head where multi_query) and Meta's OPT
    # (positions counted from 2 in their table): LayerNorm before each branch, learned
    # positions, an MLP without a gate, biases everywhere.
    "GPT2LMHeadModel": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                         learned_positions=True),
    "GPTBigCodeForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                               learned_positions=True),
    "OPTForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                        learned_positions=True),
    # Meta's XGLM (564M to 7.5B): OPT's layers under their names, fixed sinusoidal positions
    # counted from 2 (fairseq's), the embeddings times sqrt(d_model) where scale_embedding.
    "XGLMForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                         learned_positions=True),
    # EleutherAI's GPT-Neo (125M, 1.3B, 2.7B): GPT-2's layers with q, k and v apart and without
    # biases, scores unscaled, and its local layers sliding over window_size (_gpt_neo_names).
    "GPTNeoForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                           learned_positions=True),
    # EleutherAI's GPT-J (GPT-J-6B and its fine-tunes): LayerNorm, rotary over interleaved pairs
    # of the first rotary_dim dimensions of each head, attention and an MLP of GeLU without a
    # gate in parallel off one norm, under GPT-2's names.
    "GPTJForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                         interleaved_rope=True, gptj=True),
    # Salesforce's CodeGen (codegen-350M to 16B, -mono, -multi, -nl): GPT-J's layers, q, k and
    # v fused in the order of the four shards it was trained on (models/fused_weights.py).
    "CodeGenForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True,
                                            interleaved_rope=True, gptj=True),
    # TII's Falcon (7B, 40B, 180B, Falcon 2 11B): LayerNorm, rotary, an MLP of GeLU without a
    # gate, one KV head (multi_query) or KV heads of their own (new_decoder_architecture).
    "FalconForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True, falcon=True),
    # BigScience's BLOOM (and BLOOMZ): ALiBi, a LayerNorm over the embeddings and before each
    # branch, q, k and v fused per head, an MLP of GeLU (tanh) without a gate, biases
    # everywhere.
    "BloomForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True, alibi=True),
    # MosaicML's MPT (MPT-7B, MPT-30B and their chat and instruct models): ALiBi with its own
    # slopes, LayerNorm (without biases where no_bias), q, k and v fused one after the other
    # and clamped where clip_qkv, an MLP of GeLU without a gate.
    "MptForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True, alibi=True),
    # Databricks' DBRX: MPT's attention (LayerNorm without biases, q, k and v fused and clamped)
    # with KV heads of its own and rotary, over Mixtral's experts (softmax top-k,
    # renormalized), each layer's stored as three tensors (models/fused_weights.py).
    "DbrxForCausalLM": ArchitectureFlags(layer_norm=True, moe="dbrx"),
    # NVIDIA's Nemotron (Nemotron-4, Minitron): LayerNorm whose weight is stored as an offset
    # from 1, rotary over part of each head, an MLP of squared ReLU without a gate.
    "NemotronForCausalLM": ArchitectureFlags(ungated_mlp=True, layer_norm=True),
    # Tencent's Hunyuan dense models (Hunyuan-7B, Hunyuan-MT): q and k normalized per head
    # after the rotary turn (query_layernorm, key_layernorm).
    "HunYuanDenseV1ForCausalLM": ArchitectureFlags(qk_norm=True, qk_norm_after_rope=True),
    # Hunyuan-A13B: the same attention over experts (softmax, top-k renormalized, the router
    # in float32) beside a shared MLP as wide as each expert.
    "HunYuanMoEV1ForCausalLM": ArchitectureFlags(qk_norm=True, qk_norm_after_rope=True,
                                                 moe="hunyuan"),
    # Upstage's Solar Open: Llama's attention (biases on q, k and v where attention_bias)
    # over GLM-4.5's experts in every layer.
    "SolarOpenForCausalLM": ArchitectureFlags(moe="deepseek", bias_on_qkv_only=True),
    # Cohere's Command R (CohereForCausalLM): rotary over interleaved pairs in every layer.
    # Command R+ normalizes q and k per head where use_qk_norm (head_layer_norm_of).
    "CohereForCausalLM": ArchitectureFlags(cohere=True, interleaved_rope=True),
    # Command R7B and Command A (Cohere2ForCausalLM): three sliding layers in four, the
    # full-attention ones with no positional encoding.
    "Cohere2ForCausalLM": ArchitectureFlags(cohere=True, interleaved_rope=True,
                                            full_layers_nope=True),
    # Command A+ (Cohere2MoeForCausalLM): Command R7B's layers (RMSNorm where rms_norm_eps is
    # set), the first ones dense and turned (prefix_dense_*), the others' MLP experts chosen
    # by their logits, weighted by their softmax or sigmoids (expert_selection_fn), beside
    # shared experts summed with them or averaged (shared_expert_combination_strategy).
    "Cohere2MoeForCausalLM": ArchitectureFlags(cohere=True, interleaved_rope=True,
                                               full_layers_nope=True, moe="cohere2"),
    # AI2's first OLMo (OLMo-1B and 7B, -hf): Llama's layers, LayerNorms without a weight, q,
    # k and v clamped where clip_qkv is set.
    "OlmoForCausalLM": ArchitectureFlags(),
    "Olmo2ForCausalLM": ArchitectureFlags(olmo=True, projection_qk_norm=True),
    # OLMo 3: OLMo 2's layers, three in four sliding (layer_types), each kind with its rope.
    "Olmo3ForCausalLM": ArchitectureFlags(olmo=True, projection_qk_norm=True),
    # EXAONE 4: OLMo's post-norms, Qwen3's per-head q/k norms, three sliding layers in four
    # (layer_types) turning q and k, the full ones not.
    "Exaone4ForCausalLM": ArchitectureFlags(olmo=True, qk_norm=True, full_layers_nope=True),
    # OLMoE: Llama's norms, OLMo's q/k norms (q, k and v clamped where clip_qkv is set), and
    # Qwen-style experts, not renormalized.
    "OlmoeForCausalLM": ArchitectureFlags(projection_qk_norm=True, moe="qwen"),
    # AI2's FlexOlmo: OLMo 2's layers (norms after each branch) over OLMoE's experts.
    "FlexOlmoForCausalLM": ArchitectureFlags(olmo=True, projection_qk_norm=True, moe="qwen"),
    # GPT-OSS: attention sinks, biases on every projection (attention_bias), sliding and full
    # layers alternating (layer_types), experts of a clamped SwiGLU with biases behind a
    # router with a bias, stored as one tensor per layer (models/fused_weights.py), in MXFP4
    # as OpenAI publishes them (models/mxfp4.py).
    "GptOssForCausalLM": ArchitectureFlags(moe="gptoss", attention_sinks=True),
    # GLM-4.5 and 4.6 (and -Air): GLM-4's biases on q, k and v only, q/k norms where
    # use_qk_norm, rotary on part of each head, and DeepSeek-V3's experts: sigmoid scores,
    # the best groups first (n_group, topk_group), a correction bias that only chooses, the
    # chosen scores renormalized and scaled, always-on shared experts, and the first
    # first_k_dense_replace layers dense.
    "Glm4MoeForCausalLM": ArchitectureFlags(moe="deepseek", bias_on_qkv_only=True),
    # Sarvam AI's Sarvam-30B (SarvamMoEForCausalLM): GLM-4.5's layers with rotary over the
    # whole head, under Bailing's names (q, k and v fused one after the other; renamed in
    # models/fused_weights.py).
    "SarvamMoEForCausalLM": ArchitectureFlags(moe="deepseek", bias_on_qkv_only=True),
    # DeepSeek-V2 (and -Lite): latent attention (one cached latent per token, rotary over
    # interleaved pairs of a part of each head), and experts chosen by their softmax, greedily
    # or within the best groups (topk_method), scaled by routed_scaling_factor, beside
    # always-on shared experts; the first first_k_dense_replace layers dense.
    "DeepseekV2ForCausalLM": ArchitectureFlags(moe="deepseek_v2", latent_attention=True),
    # DeepSeek-V3, V3.1 and R1: V2's latent attention and V3's experts, as GLM-4.5's.
    "DeepseekV3ForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True),
    # SK Telecom's A.X K1: DeepSeek-V3's layers, the sparse blocks' output through an RMSNorm
    # (post_mlp_layernorm), the dense layers mlp_layer_types names; its checkpoints route
    # without a correction bias (read as zero) and carry the norm for dense layers too, unused.
    "AXK1ForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True),
    # Sarvam-105B (SarvamMLAForCausalLM): DeepSeek-V3's layers; transformers' config reads
    # its older fields (deepseek_yarn, num_experts) as V3's.
    "SarvamMLAForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True),
    # DeepSeek-V3.2: V3's layers, attention sparse past index_topk positions (DSA: an indexer
    # chooses them, models/dsa_indexer.py).
    "DeepseekV32ForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True),
    # GLM-5: V3.2's layers, some reusing the last full layer's choice (indexer_types).
    "GlmMoeDsaForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True,
                                              indexer_rope_interleaved=True),
    # Moonshot's Kimi Linear: Kimi Delta Attention in three layers of four, latent attention
    # without positional encoding in the fourth, DeepSeek-V3's routing over experts stored
    # as Mixtral's (block_sparse_moe, w1/w2/w3; fused_weights.py).
    # (contract/model_shape.py: kimi_linear names its delta layers' config).
    "KimiLinearForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True),
    # OpenBMB's MiniCPM3: DeepSeek-V2's latent attention (rotary over halves, not pairs) over
    # Llama's MLP, with Granite's multipliers under its own names (_minicpm3_names).
    "MiniCPM3ForCausalLM": ArchitectureFlags(latent_attention=True, granite=True),
    # Tencent's Youtu-LLM: DeepSeek-V3's latent attention over Llama's MLP in every layer.
    "YoutuForCausalLM": ArchitectureFlags(latent_attention=True),
    # GLM-4.7-Flash: DeepSeek-V3's layers, its dense ones named by mlp_layer_types.
    "Glm4MoeLiteForCausalLM": ArchitectureFlags(moe="deepseek", latent_attention=True),
    # Mistral Small 4: DeepSeek-V3's layers, experts chosen by softmax score (no correction
    # bias), and Ministral 3's query scale by position.
    "Mistral4ForCausalLM": ArchitectureFlags(moe="mistral4", latent_attention=True),
    # ERNIE 4.5's mixtures of experts: ERNIE's attention, and experts chosen by softmax score
    # plus a correction bias (moe_statics), renormalized, beside shared experts, in the layers
    # moe_layer_start_index .. moe_layer_end_index (every moe_layer_interval-th).
    "Ernie4_5_MoeForCausalLM": ArchitectureFlags(interleaved_rope=True, moe="ernie"),
    # rednote's dots.llm1: Qwen3's attention (per-head q/k norms) over DeepSeek-V3's experts.
    "Dots1ForCausalLM": ArchitectureFlags(qk_norm=True, moe="deepseek"),
    # Tencent's Hunyuan 3 (HYV3ForCausalLM): q/k norms per head before the turn, DeepSeek-V3's
    # sigmoid routing in one group (router_scaling_factor the scale) beside shared experts,
    # the first layer dense (_hy_v3_names).
    "HYV3ForCausalLM": ArchitectureFlags(qk_norm=True, moe="deepseek"),
    # Arcee's Trinity (AfmoeForCausalLM): q/k norms per head, rotary in the sliding layers
    # only, attention's output gated, a norm before and after each branch, DeepSeek-V3's
    # sigmoid routing (one group, its expert_bias the correction, route_scale the scale)
    # beside shared experts, the first num_dense_layers dense (_afmoe_names).
    "AfmoeForCausalLM": ArchitectureFlags(moe="deepseek", qk_norm=True, sandwich_norms=True,
                                          full_layers_nope=True, output_gate=True),
    # Flint: Qwen3's per-head q/k norms, attention sinks in every layer, rotary in the sliding
    # layers only; experts chosen by their sigmoid scores (no bias), renormalized where
    # norm_topk_prob, beside a shared expert added as it is; mlp_only_layers dense.
    "FlintForCausalLM": ArchitectureFlags(moe="flint", qk_norm=True, attention_sinks=True,
                                          full_layers_nope=True),
    # Kolibri: Qwen3's per-head q/k norms, rotary in the sliding layers only (in every layer
    # where sliding_window is null), a norm before and after each branch; in every layer,
    # experts chosen by their logits plus a bias, weighted by those logits' sigmoids
    # (renormalized where norm_topk_prob), beside shared experts added as they are.
    "Kolibri1ForCausalLM": ArchitectureFlags(moe="kolibri", qk_norm=True, sandwich_norms=True,
                                             full_layers_nope=True),
    # Xiaomi's MiMo-V2-Flash: Qwen2's attention (a full layer to five sliding ones, each kind
    # its rotary base, over a third of each head) over DeepSeek-V3's routing without shared
    # experts, the first layer dense.
    "MiMoV2FlashForCausalLM": ArchitectureFlags(moe="deepseek", mimo_v2=True),
    # LG's K-EXAONE (ExaoneMoE): EXAONE 4's attention (q/k norms per head, sliding layers by
    # layer_types, the full ones without positional encoding) in pre-norm layers, over
    # DeepSeek-V3's routing beside num_shared_experts shared ones.
    "ExaoneMoeForCausalLM": ArchitectureFlags(qk_norm=True, full_layers_nope=True,
                                              moe="deepseek"),
    # MiniMax-M2: q and k normalized over the whole projection (as OLMoE's), rotary on part
    # of each head, and in every layer experts under Mixtral's names chosen by sigmoid score
    # plus a correction bias, renormalized.
    "MiniMaxM2ForCausalLM": ArchitectureFlags(moe="minimax", projection_qk_norm=True),
    # Qwen3.5 (dense): three layers in four a gated delta net (linear attention with a
    # state per sequence, models/gated_delta_net.py), the fourth attention gated by q_proj's
    # second half (contract/model_shape.py: gated_queries), with
    # Qwen3's per-head q/k norms and rotary on a part of each head; norms scale by
    # 1 + weight.
    "Qwen3_5ForCausalLM": ArchitectureFlags(qk_norm=True, unit_offset_norms=True),
    # Qwen3.5's mixtures of experts (35B-A3B, 122B-A10B, 397B-A17B): its layers over
    # Qwen2-MoE's experts (renormalized, a shared expert gated by a sigmoid) in every layer.
    "Qwen3_5MoeForCausalLM": ArchitectureFlags(qk_norm=True, unit_offset_norms=True,
                                               moe="qwen"),
    # Qwen3-Next (80B-A3B): Qwen3.5-MoE's layers before it, its gated delta nets' projections
    # stored fused per key head (in_proj_qkvz, in_proj_ba; models/fused_weights.py).
    "Qwen3NextForCausalLM": ArchitectureFlags(qk_norm=True, unit_offset_norms=True,
                                              moe="qwen"),
    # Llama 4 (Scout, Maverick): rotary over interleaved pairs (Llama 4's complex rotary), three
    # layers in four rotating and attending within chunks, the fourth with no positional
    # encoding over the whole context; experts chosen by their top logit's sigmoid, which
    # scales the expert's input, beside an always-on shared expert, in the moe_layers.
    "Llama4ForCausalLM": ArchitectureFlags(interleaved_rope=True, moe="llama4", llama4=True),
    # IBM's Granite 4.0-H: Granite's multipliers over Mamba-2 layers (models/mamba2_mixer.py)
    # with an attention layer in several, no positional encoding unless
    # position_embedding_type is "rope"; experts stored as GraniteMoE's beside a shared MLP
    # (shared_mlp, fused gate and up), which is the whole MLP of a model without experts.
    "GraniteMoeHybridForCausalLM": ArchitectureFlags(granite=True, moe="granite_hybrid"),
    # IBM's Bamba: Granite 4.0-H's Mamba-2 layers with Llama's attention (rotary over a part
    # of each head) in the attn_layer_indices, and a dense MLP in every layer.
    "BambaForCausalLM": ArchitectureFlags(),
    # NVIDIA's Nemotron-H (Nemotron-H, Nemotron Nano 2, Nemotron 3): Mamba-2 layers, a few
    # attention layers, MLPs of squared ReLU without a gate, and (Nemotron 3) experts of the
    # same, routed as DeepSeek-V3's, beside a shared one; one block per layer.
    "NemotronHForCausalLM": ArchitectureFlags(moe="nemotron_h", ungated_mlp=True,
                                              mixer_blocks=True),
    # AI21's Jamba: Mamba-1 layers with a few of Llama's attention layers (no positional
    # encoding), experts in every other layer (a softmax's top-k, not renormalized).
    "JambaForCausalLM": ArchitectureFlags(moe="jamba"),
    # TII's Falcon-H1: Llama's attention beside a Mamba-2 layer in every layer, Llama's MLP.
    "FalconH1ForCausalLM": ArchitectureFlags(falcon_h1=True),
    # Mamba-2 (Mamba-Codestral): Nemotron-H's blocks, every one a Mamba-2 layer; no attention.
    "Mamba2ForCausalLM": ArchitectureFlags(mixer_blocks=True),
    # Mamba and TII's Falcon Mamba: the same blocks, every one a Mamba-1 layer.
    "MambaForCausalLM": ArchitectureFlags(mixer_blocks=True),
    "FalconMambaForCausalLM": ArchitectureFlags(mixer_blocks=True),
    # Liquid AI's LFM2: gated short convolutions (models/short_conv.py) in most layers,
    # attention with q and k normalized per head in the others; Llama's MLP.
    "Lfm2ForCausalLM": ArchitectureFlags(qk_norm=True),
    # AI2's OLMo Hybrid: gated delta nets (Qwen3.5's, their projections apart) with Llama's
    # norms in most layers, OLMo 3's attention layers among them, rotary only where its
    # config gives rope_theta.
    "OlmoHybridForCausalLM": ArchitectureFlags(olmo=True, projection_qk_norm=True),
    # LFM2's mixtures of experts (LFM2-8B-A1B): the same layers, experts after the first
    # num_dense_layers, chosen by sigmoid scores plus a bias (expert_bias), renormalized.
    "Lfm2MoeForCausalLM": ArchitectureFlags(qk_norm=True, moe="lfm2"),
    # LFM3: LFM2's convolutions and attention (Qwen3's, each head's output scaled by a sigmoid
    # gate where use_attention_gate: output_gate_of), sliding layers among the full ones, each
    # kind its own rotary, a norm before and after each branch.
    "Lfm3ForCausalLM": ArchitectureFlags(qk_norm=True, sandwich_norms=True),
    # poolside's Laguna: q/k norms per head, sliding layers among the full ones, each kind its
    # own rotary over its part of each head; attention's output scaled by the softplus of a
    # gate per head or per number (gating); experts chosen by the sigmoids of the router's
    # logits (soft-capped where moe_router_logit_softcapping) plus a bias, renormalized, scaled
    # by moe_routed_scaling_factor, beside a shared expert; the dense layers mlp_layer_types
    # names.
    "LagunaForCausalLM": ArchitectureFlags(qk_norm=True, moe="laguna"),
}
# A supported decoder with a classification head instead of its LM head, as transformers names
# it: LlamaForSequenceClassification, Qwen3ForSequenceClassification, ... (the pooling runner).
CLASSIFIER_SUFFIX = "ForSequenceClassification"
# Bare decoders (no LM head), as embedding checkpoints are saved (e5-mistral, Qwen3-Embedding
# exported by sentence-transformers): served by the pooling runner only.
BARE_DECODERS = {"LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
                 "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM"}
# Encoders (every token attends to every other): BERT, RoBERTa's and DistilBERT's families, as
# embedding models (BGE, E5, MiniLM) and cross-encoder rerankers and text classifiers
# (ms-marco MiniLM, BGE rerankers, DistilBERT SST-2), served by the pooling runner only
# (models/encoder.py). By architecture: the family, and whether a classification head follows
# the encoder.
ENCODERS = {"BertModel": ("bert", False), "BertForSequenceClassification": ("bert", True),
            "RobertaModel": ("roberta", False),
            "RobertaForSequenceClassification": ("roberta", True),
            "XLMRobertaModel": ("roberta", False),
            "XLMRobertaForSequenceClassification": ("roberta", True),
            "DistilBertModel": ("distilbert", False),
            "DistilBertForSequenceClassification": ("distilbert", True),
            "ModernBertModel": ("modernbert", False),
            "ModernBertForSequenceClassification": ("modernbert", True)}
ENCODER_MODEL_TYPES = {"bert": "BertModel", "roberta": "RobertaModel",
                       "xlm-roberta": "XLMRobertaModel", "distilbert": "DistilBertModel",
                       "modernbert": "ModernBertModel"}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "ministral": "MinistralForCausalLM", "ministral3": "Ministral3ForCausalLM",
               "mistral4": "Mistral4ForCausalLM", "cohere": "CohereForCausalLM",
               "cohere2": "Cohere2ForCausalLM", "cohere2_moe": "Cohere2MoeForCausalLM",
               "starcoder2": "Starcoder2ForCausalLM",
               "nemotron": "NemotronForCausalLM", "phi": "PhiForCausalLM",
               "stablelm": "StableLmForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
               "persimmon": "PersimmonForCausalLM",
               "gpt2": "GPT2LMHeadModel", "gpt_bigcode": "GPTBigCodeForCausalLM",
               "opt": "OPTForCausalLM", "gptj": "GPTJForCausalLM",
               "codegen": "CodeGenForCausalLM",
               "gpt_neo": "GPTNeoForCausalLM", "xglm": "XGLMForCausalLM",
               "falcon": "FalconForCausalLM", "bloom": "BloomForCausalLM",
               "mpt": "MptForCausalLM", "olmo": "OlmoForCausalLM", "dbrx": "DbrxForCausalLM",
               "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
               "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM",
               "solar_open": "SolarOpenForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "mixtral": "MixtralForCausalLM", "phimoe": "PhimoeForCausalLM",
               "qwen2_moe": "Qwen2MoeForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM", "gemma": "GemmaForCausalLM",
               "gemma2": "Gemma2ForCausalLM", "vaultgemma": "VaultGemmaForCausalLM",
               "gemma3_text": "Gemma3ForCausalLM",
               "gemma4_text": "Gemma4ForCausalLM", "gemma3n_text": "Gemma3nForCausalLM",
               "phi3": "Phi3ForCausalLM", "granite": "GraniteForCausalLM",
               "granitemoe": "GraniteMoeForCausalLM",
               "granitemoeshared": "GraniteMoeSharedForCausalLM",
               "granite_swa": "GraniteSWAForCausalLM", "nanochat": "NanoChatForCausalLM",
               "granitemoe_swa": "GraniteMoeSWAForCausalLM",
               "granitemoehybrid": "GraniteMoeHybridForCausalLM", "bamba": "BambaForCausalLM",
               "nemotron_h": "NemotronHForCausalLM", "mamba2": "Mamba2ForCausalLM",
               "mamba": "MambaForCausalLM", "falcon_mamba": "FalconMambaForCausalLM",
               "falcon_h1": "FalconH1ForCausalLM", "jamba": "JambaForCausalLM",
               "lfm2": "Lfm2ForCausalLM",
               "lfm2_moe": "Lfm2MoeForCausalLM", "olmo_hybrid": "OlmoHybridForCausalLM",
               "lfm3": "Lfm3ForCausalLM", "mellum": "MellumForCausalLM",
               "laguna": "LagunaForCausalLM",
               "smollm3": "SmolLM3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
               "seed_oss": "SeedOssForCausalLM", "exaone4": "Exaone4ForCausalLM",
               "ernie4_5": "Ernie4_5ForCausalLM", "glm4": "Glm4ForCausalLM",
               "glm": "GlmForCausalLM", "helium": "HeliumForCausalLM",
               "apertus": "ApertusForCausalLM",
               "exaone": "ExaoneForCausalLM", "internlm3": "InternLM3ForCausalLM",
               "arcee": "ArceeForCausalLM",
               "olmo3": "Olmo3ForCausalLM", "olmoe": "OlmoeForCausalLM",
               "flex_olmo": "FlexOlmoForCausalLM",
               "gpt_oss": "GptOssForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
               "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
               "glm4_moe_lite": "Glm4MoeLiteForCausalLM", "minimax_m2": "MiniMaxM2ForCausalLM",
               "deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM",
               "youtu": "YoutuForCausalLM", "cwm": "CwmForCausalLM", "jais2": "Jais2ForCausalLM",
               "exaone_moe": "ExaoneMoeForCausalLM", "mimo_v2_flash": "MiMoV2FlashForCausalLM",
               "kimi_linear": "KimiLinearForCausalLM", "hyperclovax": "HyperCLOVAXForCausalLM",
               "minicpm3": "MiniCPM3ForCausalLM", "afmoe": "AfmoeForCausalLM",
               "flint": "FlintForCausalLM", "kolibri1": "Kolibri1ForCausalLM",
               "hy_v3": "HYV3ForCausalLM", "iquestcoder": "IQuestCoderForCausalLM",
               "sarvam_moe": "SarvamMoEForCausalLM", "sarvam_mla": "SarvamMLAForCausalLM",
               "axk1": "AXK1ForCausalLM",
               "dots1": "Dots1ForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
               "qwen3_5_text": "Qwen3_5ForCausalLM", "llama4_text": "Llama4ForCausalLM",
               "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
               "qwen3_next": "Qwen3NextForCausalLM",
               # The text models of Qwen's vision-language models: on text alone their
               # multimodal rotary embedding turns every section by the same position, which
               # is the ordinary one.
               "qwen2_vl_text": "Qwen2ForCausalLM", "qwen2_5_vl_text": "Qwen2ForCausalLM",
               "qwen3_vl_text": "Qwen3ForCausalLM", "qwen3_vl_moe_text": "Qwen3MoeForCausalLM"}
QWEN3_VL_MOE = "qwen3_vl_moe_text"
QWEN3_5_MOE = "qwen3_5_moe_text"
LAGUNA = "laguna"
AXK1 = "axk1"
XGLM = "xglm"
# Multimodal architectures whose language model attends causally over text alone, so that on
# text it is exactly its causal decoder: served text-only (models/multimodal.py). PaliGemma's
# prompt attends both ways: not here.
MULTIMODAL_TEXT_MODELS = ("Gemma3ForConditionalGeneration", "Gemma4ForConditionalGeneration",
                          "Gemma3nForConditionalGeneration",
                          "Mistral3ForConditionalGeneration",
                          "LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
                          "LlavaOnevisionForConditionalGeneration",
                          "InternVLForConditionalGeneration",
                          "Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration",
                          "Qwen2VLForConditionalGeneration",
                          "Qwen2_5_VLForConditionalGeneration",
                          "Qwen3VLForConditionalGeneration",
                          "Qwen3VLMoeForConditionalGeneration",
                          "Qwen3_5ForConditionalGeneration",
                          "Qwen3_5MoeForConditionalGeneration",
                          "Llama4ForConditionalGeneration")


@dataclass(frozen=True)
class MoeNames:
    """Where a mixture-of-experts checkpoint keeps its parts, under each decoder layer."""

    block: str   # the sparse block: {block}.{router}, {block}.experts.{e}.{part}
    gate: str | None  # each expert's projections (no gate: up, the activation, down)
    up: str
    down: str
    router: str = "gate"
    shared: str = "shared_expert"  # the shared expert (Qwen2-MoE's; GLM's shared_experts)
    shared_gated: bool = True  # Qwen2-MoE gates it by a sigmoid; GLM adds it as it is


MOE_NAMES = {"qwen": MoeNames("mlp", "gate_proj", "up_proj", "down_proj"),
             "mixtral": MoeNames("block_sparse_moe", "w1", "w3", "w2"),
             "granite": MoeNames("block_sparse_moe", "gate_proj", "up_proj", "down_proj"),
             "gptoss": MoeNames("mlp", "gate_proj", "up_proj", "down_proj", "router"),
             "deepseek": MoeNames("mlp", "gate_proj", "up_proj", "down_proj",
                                  shared="shared_experts", shared_gated=False)}
MOE_NAMES["deepseek_v2"] = MOE_NAMES["deepseek"]
MOE_NAMES["minimax"] = MOE_NAMES["dbrx"] = MOE_NAMES["phimoe"] = MOE_NAMES["mixtral"]
MOE_NAMES["ernie"] = MOE_NAMES["deepseek"]
MOE_NAMES["mistral4"] = MOE_NAMES["deepseek"]
MOE_NAMES["granite_hybrid"] = MoeNames("block_sparse_moe", "gate_proj", "up_proj", "down_proj",
                                       shared="shared_mlp", shared_gated=False)
MOE_NAMES["lfm2"] = MoeNames("feed_forward", "w1", "w3", "w2")
# Nemotron 3: each expert and the shared one an MLP without a gate, the block the layer's mixer.
MOE_NAMES["nemotron_h"] = MoeNames("mixer", None, "up_proj", "down_proj",
                                   shared="shared_experts", shared_gated=False)
# Jamba: its feed_forward read as mlp (models/fused_weights.py), the router named router.
MOE_NAMES["jamba"] = MoeNames("mlp", "gate_proj", "up_proj", "down_proj", "router")
MOE_NAMES["hunyuan"] = MoeNames("mlp", "gate_proj", "up_proj", "down_proj", shared="shared_mlp",
                                shared_gated=False)
MOE_NAMES["flint"] = MoeNames("mlp", "gate_proj", "up_proj", "down_proj", shared_gated=False)
MOE_NAMES["kolibri"] = MOE_NAMES["deepseek"]
MOE_NAMES["cohere2"] = MOE_NAMES["deepseek"]
MOE_NAMES["laguna"] = MoeNames("mlp", "gate_proj", "up_proj", "down_proj", shared_gated=False)
MOE_NAMES["llama4"] = MoeNames("feed_forward", "gate_proj", "up_proj", "down_proj", "router",
                               shared_gated=False)


@dataclass(frozen=True)
class GroupedRouting:
    """DeepSeek's routing: experts in `groups` groups, only the topk_group best groups'
    eligible, the chosen weights times routed_scale. V3 (GLM-4.5) scores by sigmoid plus a
    correction bias and ranks a group by its two best; V2 by softmax and its best
    (`softmax`, `group_top` 1), with no bias; ERNIE 4.5 by softmax plus a correction bias;
    Mistral 4 by softmax, ranking a group by its two best."""

    groups: int
    topk_group: int
    routed_scale: float
    softmax: bool = False
    correction: tuple[int, ...] | None = None  # the correction bias's shape, as stored
    group_top: int = 2  # how many of a group's best scores rank it
    bias_on_logits: bool = False  # Kolibri: the bias joins the logits, not their sigmoids
    logit_softcap: float | None = None  # Laguna: cap * tanh(logits / cap) before the scores


@dataclass(frozen=True)
class MoeShape:
    """A mixture-of-experts model's sparse blocks: each token row runs `top_k` of
    `num_experts` experts of MLP width `width`, weighted by the router's softmax (divided by
    the chosen ones' sum where `renormalize`), plus, in Qwen2-MoE, a shared expert of width
    `shared_width` gated by a sigmoid."""

    names: MoeNames
    num_experts: int
    top_k: int
    width: int
    shared_width: int
    renormalize: bool
    sparse_step: int
    dense_layers: frozenset[int]
    # GPT-OSS: biases on the router and on every expert projection, and the experts'
    # clamped SwiGLU (alpha, limit) in place of SiLU.
    biased: bool = False
    swiglu: tuple[float, float] | None = None
    # DeepSeek-V2/V3 and GLM-4.5: chosen within the best groups, scaled (GroupedRouting).
    grouped: GroupedRouting | None = None
    # Llama 4: the top_k logits' sigmoids weigh the experts' inputs, not their outputs.
    scales_inputs: bool = False
    # The experts' activation: of the gate (ACTIVATIONS), or of up where they have none.
    activation: str = "silu"
    # Nemotron 3 Super: the experts work in a narrower space, projected into and out of it
    # (fc1_latent_proj, fc2_latent_proj); None: in the model's width.
    latent_size: int | None = None
    # Hunyuan: the router computes in float32 (DeepSeek's grouped routers always do).
    float32_router: bool = False
    # PhiMoE: sparsemixer's routing of two experts, within this relative distance (its
    # router_jitter_noise) of each one's logit; None: a softmax's top_k.
    sparsemixer: float | None = None
    # Command A+: the routed experts' output and the shared experts' averaged, not summed.
    averages_shared: bool = False
    # A.X K1: the block's output through an RMSNorm of this epsilon (post_mlp_layernorm).
    post_norm_eps: float | None = None

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` has the sparse block (else a dense MLP of the
        config's intermediate_size): Qwen's decoder_sparse_step and mlp_only_layers."""
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0


def encoder_of(config: Any) -> str | None:
    """The encoder architecture (of ENCODERS) the checkpoint is, None for any other."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in ENCODERS:
            return name
    return None if names else ENCODER_MODEL_TYPES.get(getattr(config, "model_type", ""))


def is_bare_encoder(config: Any) -> bool:
    """Whether the checkpoint is an encoder without a classification head (an embedding
    model)."""
    name = encoder_of(config)
    return name is not None and not ENCODERS[name][1]


def position_offset(config: Any) -> int:
    """Where an encoder's positions start in its position embeddings: RoBERTa's family counts
    from its padding id plus one (transformers' create_position_ids_from_input_ids on an
    unpadded prompt), BERT from 0, as does every decoder (which has none)."""
    encoder = encoder_of(config)
    if encoder is None or ENCODERS[encoder][0] != "roberta":
        return 0
    return int(config.pad_token_id) + 1


# Architectures some checkpoints name as their own remote code spells them (MosaicML's MPT).
SPELLED_OTHERWISE = {"MPTForCausalLM": "MptForCausalLM"}


def architecture_of(config: Any) -> str:
    if encoder := encoder_of(config):
        return encoder
    # Gemma 4's "vision" lets an image's rows see each other; its text stays causal.
    if getattr(config, "use_bidirectional_attention", False) not in (False, None, "vision"):
        raise ModelLoadError("the model attends in both directions (an encoder, such as "
                             "EmbeddingGemma); tokenmill runs causal decoders only")
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        name = SPELLED_OTHERWISE.get(name, name)
        if name in SUPPORTED:
            return name
        if name in BARE_DECODERS:
            return BARE_DECODERS[name]
        if causal := _classified_decoder(name):
            return causal
    by_type = MODEL_TYPES.get(getattr(config, "model_type", ""))
    if by_type and not names:
        return by_type
    if any(name.endswith("ForConditionalGeneration") for name in names):
        raise ModelLoadError(f"architecture {names} is a multimodal model (text with images or "
                             "audio); tokenmill serves text-only models, and the language model "
                             f"of {', '.join(MULTIMODAL_TEXT_MODELS)} (text only)")
    raise ModelLoadError(
        f"architecture {names or config.model_type!r} is not supported; tokenmill runs "
        f"{', '.join(SUPPORTED)} (their bare decoders for embeddings: "
        f"{', '.join(BARE_DECODERS)}; and their *{CLASSIFIER_SUFFIX} classifiers), and the "
        f"encoders {', '.join(ENCODERS)}"
    )


def declare_attention_free(config: Any) -> None:
    """Give an attention-free config (Mamba-2's: every layer a state, no attention heads
    named) zero attention heads and KV heads, the engine's reading of having none."""
    kinds = getattr(config, "layer_types", None) or ()
    if hasattr(config, "num_attention_heads") or not kinds or "full_attention" in kinds:
        return
    config.num_attention_heads = config.num_key_value_heads = 0


# The model types whose configs name their layers GPT-2's way (or OPT's), and those of them
# with learned positions.
GPT2_NAMED_TYPES = ("gpt2", "gpt_bigcode", "opt", "gptj", "codegen", "bloom")
LEARNED_POSITION_TYPES = ("gpt2", "gpt_bigcode", "opt")


def _gpt2_family_names(config: Any) -> None:
    """GPT-2's, GPT-BigCode's, OPT's, GPT-J's (and CodeGen's) and BLOOM's: the MLP's width
    (n_inner, else four times the hidden size; OPT's ffn_dim), its activation
    (activation_function; BLOOM's GeLU, tanh), the biases (OPT's enable_bias, GPT-2's,
    GPT-BigCode's and BLOOM's always), the LayerNorm epsilon, and GPT-J's rotated part of each
    head (rotary_dim, none: all of it)."""
    model_type = config.model_type
    opt = model_type == "opt"
    width = config.ffn_dim if opt else getattr(config, "n_inner", None) or 4 * config.hidden_size
    config.intermediate_size = int(width)
    config.hidden_act = "gelu_pytorch_tanh" if model_type == "bloom" else \
        config.activation_function
    config.layer_norm_eps = 1e-5 if opt else float(config.layer_norm_epsilon)
    if model_type in ("gptj", "codegen"):
        head_dim = config.hidden_size // config.num_attention_heads
        config.partial_rotary_factor = (config.rotary_dim or head_dim) / head_dim
        return
    config.attention_bias = config.mlp_bias = bool(config.enable_bias) if opt else True


def _gpt_neo_names(config: Any) -> None:
    """GPT-Neo's: the MLP's width (intermediate_size, else four times the hidden size), its
    activation, the LayerNorm epsilon, biases on the output projection and the MLP only,
    scores unscaled (softmax_scale 1), and its "local" attention_layers sliding over
    window_size tokens, the others attending to the whole context."""
    config.intermediate_size = int(config.intermediate_size or 4 * config.hidden_size)
    config.hidden_act = config.activation_function
    config.layer_norm_eps = float(config.layer_norm_epsilon)
    config.attention_bias, config.attention_out_bias, config.mlp_bias = False, True, True
    config.softmax_scale = 1.0
    config.layer_types = ["sliding_attention" if kind == "local" else "full_attention"
                          for kind in config.attention_layers]
    config.sliding_window = int(config.window_size)


def _mpt_names(config: Any) -> None:
    """MPT's: the MLP's width (expansion_ratio times d_model), activation (GeLU), biases (none
    where no_bias), LayerNorm epsilon, context length (max_seq_len), and its attention's
    clip_qkv and softmax_scale."""
    attn = config.attn_config
    config.intermediate_size = int(config.expansion_ratio * config.hidden_size)
    config.hidden_act = "gelu"
    config.attention_bias = config.mlp_bias = not config.no_bias
    config.layer_norm_eps = float(config.layer_norm_epsilon)
    config.max_position_embeddings = int(config.max_seq_len)
    config.clip_qkv = attn.clip_qkv
    config.softmax_scale = attn.softmax_scale


def _dbrx_names(config: Any) -> None:
    """DBRX's: its experts (ffn_config), their width and activation, the clamp of q, k and v,
    norms without biases, the context length and the rotary base."""
    ffn = config.ffn_config
    config.num_local_experts = int(ffn.moe_num_experts)
    config.num_experts_per_tok = int(ffn.moe_top_k)
    config.intermediate_size = int(ffn.ffn_hidden_size)
    config.hidden_act = (ffn.ffn_act_fn or {}).get("name", "silu")
    config.clip_qkv = config.attn_config.clip_qkv
    config.no_bias = True
    config.layer_norm_eps = 1e-5
    config.max_position_embeddings = int(config.max_seq_len)
    # Its rotary base is attn_config's (transformers 5 reads a default base in its place).
    theta = getattr(config.attn_config, "rope_theta", None)
    if theta is not None:
        config.rope_parameters = {"rope_type": "default", "rope_theta": float(theta)}


def _falcon_names(config: Any) -> None:
    """Falcon's: its KV heads (one where multi_query, num_kv_heads with
    new_decoder_architecture, else one per query head), MLP width, activation, biases and
    LayerNorm epsilon."""
    heads = config.num_attention_heads
    config.num_key_value_heads = int(config.num_kv_heads or heads) if \
        config.new_decoder_architecture else 1 if config.multi_query else heads
    config.intermediate_size = int(config.ffn_hidden_size or 4 * config.hidden_size)
    config.hidden_act = config.activation
    config.attention_bias = config.mlp_bias = bool(config.bias)
    config.layer_norm_eps = float(config.layer_norm_epsilon)


def _xglm_names(config: Any) -> None:
    """XGLM's: the MLP's width (ffn_dim), its activation, torch's LayerNorm epsilon, biases on
    every projection."""
    config.intermediate_size = int(config.ffn_dim)
    config.hidden_act = config.activation_function
    config.layer_norm_eps = 1e-5
    config.attention_bias = config.mlp_bias = True


def _laguna_names(config: Any) -> None:
    """Laguna's query heads, which its config may give per layer
    (num_attention_heads_per_layer): one count for every layer, else ModelLoadError."""
    counts = set(getattr(config, "num_attention_heads_per_layer", None) or ())
    if len(counts) > 1:
        raise ModelLoadError(f"num_attention_heads_per_layer differs between layers "
                             f"({sorted(counts)}), which is not supported")
    if counts:
        config.num_attention_heads = counts.pop()


def _persimmon_names(config: Any) -> None:
    """Persimmon's biases, on every projection, which its config does not name."""
    config.attention_bias = config.mlp_bias = True


def _phimoe_names(config: Any) -> None:
    """PhiMoE's LayerNorm takes its epsilon from rms_norm_eps."""
    config.layer_norm_eps = config.rms_norm_eps


def _minicpm3_names(config: Any) -> None:
    """MiniCPM3's embeddings times scale_emb, each branch times scale_depth / sqrt(layers) as
    it joins the stream, the last hidden state divided by hidden_size / dim_model_base (its
    config's logits_scaling, the same as dividing the logits): Granite's multipliers. Its
    latent attention turns the two halves of the rotary part, not adjacent pairs."""
    config.embedding_multiplier = float(config.scale_emb)
    config.residual_multiplier = float(config.scale_depth) / config.num_hidden_layers ** 0.5
    config.rope_interleave = False


def _afmoe_names(config: Any) -> None:
    """AFMoE routes as DeepSeek-V3 in one group, the chosen scores renormalized and scaled
    by route_scale."""
    config.n_group = config.topk_group = 1
    config.norm_topk_prob = True
    config.routed_scaling_factor = float(config.route_scale or 1.0)


def _hy_v3_names(config: Any) -> None:
    """Hunyuan 3 routes as DeepSeek-V3 in one group, the chosen scores renormalized and
    scaled by router_scaling_factor."""
    config.n_group = config.topk_group = 1
    config.norm_topk_prob = True
    config.routed_scaling_factor = float(config.router_scaling_factor)


def _gemma3n_names(config: Any) -> None:
    """Gemma 3n lists an MLP width per layer; the released models' are all one."""
    widths = config.intermediate_size
    if isinstance(widths, (list, tuple)):
        if len(set(widths)) != 1:
            raise ModelLoadError(f"intermediate_size {list(widths)}: MLPs of different widths "
                                 "per layer are not supported; Gemma 3n E2B's and E4B's are "
                                 "one width")
        config.intermediate_size = int(widths[0])


# Each family whose config names what the engine reads its own way, by model type, and how.
FAMILY_NAMES = {**dict.fromkeys(GPT2_NAMED_TYPES, _gpt2_family_names), "mpt": _mpt_names,
                "dbrx": _dbrx_names, "falcon": _falcon_names, "phimoe": _phimoe_names,
                "gemma3n_text": _gemma3n_names, "minicpm3": _minicpm3_names,
                "afmoe": _afmoe_names, "hy_v3": _hy_v3_names,
                "persimmon": _persimmon_names, "gpt_neo": _gpt_neo_names,
                LAGUNA: _laguna_names, XGLM: _xglm_names}


def declare_family_names(config: Any) -> None:
    """Give a config that names the MLP's width, its activation, biases, KV heads and the like
    its own way (FAMILY_NAMES) the names the engine reads, at load."""
    declare = FAMILY_NAMES.get(getattr(config, "model_type", None))
    if declare is not None:
        declare(config)


def parallel_norms_of(config: Any) -> int:
    """How a layer's attention and MLP read the stream: 0 in sequence (the MLP after attention
    joined it); 1 side by side off one norm (Cohere, Phi-2, GPT-J, StableLM and Falcon 7B
    where their configs say so); 2 side by side, each off its own norm (GPT-NeoX where
    use_parallel_residual, Falcon 40B/180B's ln_attn and ln_mlp)."""
    flags = flags_of(config)
    if flags.cohere or flags.phi or flags.gptj:
        return 1
    if flags.gpt_neox:
        return 2 if config.use_parallel_residual else 0
    if flags.falcon and config.new_decoder_architecture:
        return 2 if (config.num_ln_in_parallel_attn or 2) == 2 else 1
    if flags.falcon:
        return 1 if config.parallel_attn else 0
    return int(config.model_type == "stablelm" and bool(config.use_parallel_residual))


def learned_position_offset(config: Any) -> int:
    """The row of position 0 in a learned position table: OPT's (and XGLM's sinusoids) count
    from 2."""
    return 2 if config.model_type in ("opt", XGLM) else 0


def output_gate_of(config: Any) -> str | None:
    """How attention's output is gated by a function (output_gate_activation_of) of a
    projection of the layer's input: "element" (AFMoE's, a gate per output number), "head"
    (LFM3's where use_attention_gate, one per head; Laguna's by its gating), None where it is
    not."""
    if flags_of(config).output_gate:
        return "element"
    if getattr(config, "model_type", None) == "lfm3" and config.use_attention_gate:
        return "head"
    if getattr(config, "model_type", None) == LAGUNA:
        return "element" if config.gating == "per-element" else "head"
    return None


def output_gate_activation_of(config: Any) -> str:
    """The function of attention's output gate: Laguna's softplus, computed in float32; the
    others' sigmoid."""
    return "softplus" if getattr(config, "model_type", None) == LAGUNA else "sigmoid"


def head_layer_norm_of(config: Any) -> str | None:
    """How q and k are normalized per head by a LayerNorm: "cohere" (Command R+'s use_qk_norm:
    Cohere's LayerNorm, a weight per head), "per_head" (StableLM 2 12B's qk_layernorm: a
    LayerNorm without a bias per head), "shared" (Persimmon's and Phi's qk_layernorm: one
    LayerNorm with a bias for every head); None where they are not (or by an RMSNorm: the
    qk_norm flag)."""
    if flags_of(config).cohere and getattr(config, "use_qk_norm", False):
        return "cohere"
    if not getattr(config, "qk_layernorm", False):
        return None
    kinds = {"stablelm": "per_head", "persimmon": "shared", "phi": "shared"}
    return kinds.get(getattr(config, "model_type", None))


def check_features(config: Any) -> None:
    """ModelLoadError for what a supported architecture's config asks that is not computed
    here."""
    for field in ("num_experts", "moe_topk"):  # per layer (Hunyuan's): one value for all
        if isinstance(getattr(config, field, None), (list, tuple)):
            _per_model(getattr(config, field), field)
    if getattr(config, "model_type", None) in LEARNED_POSITION_TYPES:
        _check_learned_position_family(config)
    if getattr(config, "model_type", None) == "bloom" and \
            config.apply_residual_connection_post_layernorm:
        raise ModelLoadError("apply_residual_connection_post_layernorm (the residual taken "
                             "after each norm) is not supported; BLOOM's checkpoints take it "
                             "before")
    if getattr(config, "model_type", None) == "mpt":
        _check_mpt(config)
    if getattr(config, "model_type", None) == "dbrx" and \
            config.ffn_config.moe_normalize_expert_weights not in (None, 1, 1.0):
        raise ModelLoadError(f"moe_normalize_expert_weights "
                             f"{config.ffn_config.moe_normalize_expert_weights} (an L-p norm "
                             "of the chosen weights other than their sum) is not supported")
    if getattr(config, "model_type", None) == "falcon" and config.alibi:
        raise ModelLoadError("alibi (Falcon-RW's linear attention biases by distance) is not "
                             "supported; Falcon's rotary models are")
    for kind in LAYER_TYPES:
        try:
            layer_type_theta(config, kind)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
    if getattr(config, "index_topk", None):
        _check_sparse_attention(config)


def _check_sparse_attention(config: Any) -> None:
    """GLM-5's shared layers reuse an earlier full layer's choice of positions, so the first
    layer must be full."""
    kinds = getattr(config, "indexer_types", None)
    if kinds and (set(kinds) - {"full", "shared"} or kinds[0] != "full"):
        raise ModelLoadError(f"indexer_types {list(kinds)}: each is 'full' or 'shared', and "
                             "the first layer's 'full' (a shared layer reuses the last full "
                             "layer's choice)")


def _check_learned_position_family(config: Any) -> None:
    """Refuse what GPT-2's, GPT-BigCode's and OPT's configs can ask beyond the released
    models' layers: OPT-350m's norms after each branch and its narrower embeddings, GPT-2's
    scores unscaled or scaled by layer."""
    if config.model_type == "opt":
        if not config.do_layer_norm_before:
            raise ModelLoadError("do_layer_norm_before false (OPT-350m's norms after each "
                                 "branch) is not supported; the other OPT models norm before")
        if config.word_embed_proj_dim != config.hidden_size:
            raise ModelLoadError(f"word_embed_proj_dim {config.word_embed_proj_dim} (embeddings "
                                 f"narrower than hidden_size {config.hidden_size}, OPT-350m's) "
                                 "is not supported")
        if not config.layer_norm_elementwise_affine:
            raise ModelLoadError("layer_norm_elementwise_affine false (LayerNorm without a "
                                 "weight) is not supported")
        return
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise ModelLoadError("scale_attn_by_inverse_layer_idx (scores scaled by 1 / layer) is "
                             "not supported")
    if not getattr(config, "scale_attn_weights", True):
        raise ModelLoadError("scale_attn_weights false (unscaled attention scores) is not "
                             "supported")
    if getattr(config, "add_cross_attention", False):
        raise ModelLoadError("add_cross_attention (a decoder attending to an encoder) is not "
                             "supported")


def _check_mpt(config: Any) -> None:
    """Refuse what MPT's config can ask beyond its released models' layers."""
    attn = config.attn_config
    for field, wanted in (("attn_type", "multihead_attention"), ("qk_ln", False),
                          ("prefix_lm", False), ("alibi", True)):
        if getattr(attn, field) != wanted:
            raise ModelLoadError(f"attn_config.{field} {getattr(attn, field)!r} is not "
                                 f"supported (MPT's released models have {wanted!r})")
    if config.logit_scale is not None:
        raise ModelLoadError(f"logit_scale {config.logit_scale!r} is not supported")


def _classified_decoder(name: str) -> str | None:
    """The causal architecture under sequence classifier `name` (LlamaForSequenceClassification:
    LlamaForCausalLM), None if `name` is no classifier of a supported one."""
    if not name.endswith(CLASSIFIER_SUFFIX):
        return None
    causal = name[:-len(CLASSIFIER_SUFFIX)] + "ForCausalLM"
    return causal if causal in SUPPORTED else None


def _token_classifier(config: Any, tokens: Any) -> Classifier:
    """vLLM's classifier_from_token, for a causal LM served as a classifier (with
    architectures overridden to its *ForSequenceClassification): the head is made of the LM
    head's rows for those tokens; with is_original_qwen3_reranker (or method
    from_2_way_softmax) of two tokens' rows, the second's less the first's. A causal LM read
    as a reranker reads a pair as one text unless use_pad_token says otherwise."""
    if not isinstance(tokens, list) or not tokens or \
            not all(isinstance(t, str) and t for t in tokens):
        raise ModelLoadError(f"classifier_from_token must be a list of tokens such as "
                             f'["no", "yes"], got {tokens!r}')
    two_way = bool(getattr(config, "is_original_qwen3_reranker", False)) or \
        getattr(config, "method", None) == "from_2_way_softmax"
    if two_way and len(tokens) != 2:
        raise ModelLoadError(f"a two-way classifier (is_original_qwen3_reranker, "
                             f"from_2_way_softmax) reads two tokens in classifier_from_token, "
                             f"got {len(tokens)}")
    return Classifier((tokens[1],) if two_way else tuple(tokens),
                      joins_pairs=getattr(config, "use_pad_token", False) is False,
                      from_tokens=tuple(tokens), two_way=two_way)


def is_sequence_classifier(config: Any) -> bool:
    """Whether the checkpoint is a decoder with a classification head (`score`, one row per
    label, over the last token's hidden state) instead of its LM head, or an encoder with
    one (over its first token's)."""
    names = list(getattr(config, "architectures", None) or [])
    if encoder := encoder_of(config):
        return ENCODERS[encoder][1]
    return any(_classified_decoder(name) for name in names) and \
        not any(name in SUPPORTED for name in names)


def classifier_of(config: Any) -> Classifier | None:
    """A sequence classifier's head as the config describes it (its labels in order, and
    whether they are independent); None for any other checkpoint."""
    if not is_sequence_classifier(config):
        return None
    tokens = getattr(config, "classifier_from_token", None)
    if tokens is not None:
        return _token_classifier(config, tokens)
    names = getattr(config, "id2label", None) or {}
    count = int(getattr(config, "num_labels", len(names)) or len(names))
    if count < 1:
        raise ModelLoadError("the classifier's config has no labels (num_labels, id2label)")
    by_index = {int(k): str(v) for k, v in names.items()}
    labels = tuple(by_index.get(i, f"LABEL_{i}") for i in range(count))
    multi = getattr(config, "problem_type", None) == "multi_label_classification"
    token_types = encoder_of(config) is not None and \
        int(getattr(config, "type_vocab_size", 1) or 1) > 1
    return Classifier(labels, multi_label=multi,
                      joins_pairs=getattr(config, "use_pad_token", True) is False,
                      token_types=token_types)


def is_bare_decoder(config: Any) -> bool:
    """Whether the checkpoint holds a decoder without its LM head (an embedding model)."""
    names = list(getattr(config, "architectures", None) or [])
    return any(name in BARE_DECODERS for name in names) and \
        not any(name in SUPPORTED for name in names)


def flags_of(config: Any) -> ArchitectureFlags:
    return SUPPORTED[architecture_of(config)]


def moe_shape_of(config: Any) -> MoeShape | None:
    """The model's sparse blocks, or None for a dense model (or a MoE config with no
    experts)."""
    style = flags_of(config).moe
    experts = num_experts_of(config)
    if style is None or not experts:
        return None
    names = MOE_NAMES[style]
    activation = activation_of(config)
    if names.gate is not None and activation != "silu":
        raise ModelLoadError(f"activation {activation!r} is not supported in experts (silu)")
    widths = ModelShape.of(config)
    return MoeShape(
        names=names, num_experts=experts,
        top_k=_per_model(config.num_experts_per_tok, "moe_topk"),
        width=widths.expert_intermediate_size,
        shared_width=widths.shared_expert_intermediate_size,
        # Mixtral's, Granite's and GPT-OSS's routers softmax the chosen logits alone;
        # MiniMax-M2's, ERNIE's, Qwen3-VL's and Qwen3.5's divide the chosen scores by their
        # sum.
        renormalize=style in ("mixtral", "granite", "granite_hybrid", "gptoss", "minimax",
                              "ernie", "hunyuan", "laguna") or
        (style == "dbrx" and config.ffn_config.moe_normalize_expert_weights is not None) or
        bool(getattr(config, "norm_topk_prob", False)) or
        getattr(config, "model_type", None) in (QWEN3_VL_MOE, QWEN3_5_MOE) or
        (style == "cohere2" and _cohere2_selection(config) == "softmax"),
        sparse_step=int(getattr(config, "decoder_sparse_step", None) or
                        getattr(config, "moe_layer_interval", None) or 1),
        dense_layers=_dense_layers(config),
        biased=style == "gptoss",
        grouped=_grouped_routing(config, style),
        scales_inputs=style == "llama4",
        swiglu=_gptoss_swiglu(config) if style == "gptoss" else None,
        activation=activation,
        latent_size=getattr(config, "moe_latent_size", None),
        float32_router=style == "hunyuan",
        sparsemixer=_sparsemixer(config) if style == "phimoe" else None,
        averages_shared=style == "cohere2" and _cohere2_combination(config) == "average",
        post_norm_eps=rms_norm_eps_of(config) if getattr(config, "model_type", None) == AXK1
        else None)


def _cohere2_selection(config: Any) -> str:
    """Command A+'s expert_selection_fn: softmax (of the chosen logits alone) or sigmoid."""
    name = getattr(config, "expert_selection_fn", "softmax")
    if name not in ("softmax", "sigmoid"):
        raise ModelLoadError(f"expert_selection_fn {name!r} is not supported (softmax, sigmoid)")
    return name


def _cohere2_combination(config: Any) -> str:
    """Command A+'s shared_expert_combination_strategy: sum or average."""
    name = getattr(config, "shared_expert_combination_strategy", "average")
    if name not in ("sum", "average"):
        raise ModelLoadError(f"shared_expert_combination_strategy {name!r} is not supported "
                             "(sum, average)")
    return name


def _sparsemixer(config: Any) -> float:
    """PhiMoE's router_jitter_noise; ModelLoadError for other than two experts a token, the
    only count its routing defines."""
    if int(config.num_experts_per_tok) != 2:
        raise ModelLoadError(f"num_experts_per_tok {config.num_experts_per_tok}: PhiMoE's "
                             "sparsemixer routing chooses two experts")
    return float(config.router_jitter_noise)


def _per_model(value: Any, field: str) -> int:
    """A count a config may give per layer (Hunyuan's moe_topk): its one value; layers that
    differ are refused."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ModelLoadError(f"{field} differs between layers ({sorted(set(value))}), "
                                 "which is not supported")
        value = value[0]
    return int(value)


def _gptoss_swiglu(config: Any) -> tuple[float, float]:
    """GPT-OSS's clamped SwiGLU (alpha, limit), with the values its MLP hard-codes where the
    installed transformers' config has no such fields."""
    return (float(getattr(config, "swiglu_alpha", 1.702)),
            float(getattr(config, "swiglu_limit", 7.0)))


def _dense_layers(config: Any) -> frozenset[int]:
    """The layers of a mixture of experts with a dense MLP instead: Qwen's mlp_only_layers,
    DeepSeek's first first_k_dense_replace, GLM-4.7-Flash's "dense" mlp_layer_types, those
    outside ERNIE 4.5's moe_layer_start_index .. moe_layer_end_index."""
    kinds = getattr(config, "mlp_layer_types", None) or ()
    first_dense = getattr(config, "first_k_dense_replace", None) or \
        getattr(config, "num_dense_layers", None) or 0  # LFM2's
    dense = (frozenset(getattr(config, "mlp_only_layers", None) or ()) |
             frozenset(range(int(first_dense))) |
             frozenset(i for i, kind in enumerate(kinds) if kind == "dense"))
    if getattr(config, "model_type", None) == "jamba":  # one expert: a dense MLP
        dense |= frozenset(i for i, n in enumerate(config.layers_num_experts) if n == 1)
    if getattr(config, "model_type", None) == "llama4_text":  # Llama 4: its moe_layers
        dense |= frozenset(range(config.num_hidden_layers)) - frozenset(config.moe_layers)
    first = getattr(config, "moe_layer_start_index", None)
    if first is not None:  # ERNIE 4.5: experts from first to last (-1: the last layer)
        layers = config.num_hidden_layers
        last = int(getattr(config, "moe_layer_end_index", -1))
        last = layers - 1 if last < 0 else last
        dense |= frozenset(i for i in range(layers) if i < int(first) or i > last)
    return dense


def _grouped_routing(config: Any, style: str) -> GroupedRouting | None:
    """DeepSeek's routing as the config sets it; V2's greedy top_k, MiniMax-M2's and ERNIE
    4.5's are one group."""
    if style not in ("deepseek", "deepseek_v2", "minimax", "ernie", "mistral4", "nemotron_h",
                     "lfm2", "flint", "kolibri", "cohere2", "laguna"):
        return None
    scale = float(getattr(config, "routed_scaling_factor", 1.0) or 1.0)
    experts = num_experts_of(config)
    if style == "lfm2":  # one group; the bias where use_expert_bias
        return GroupedRouting(1, 1, scale, correction=(experts,) if getattr(
            config, "use_expert_bias", False) else None)
    if style == "minimax":
        return GroupedRouting(1, 1, scale, correction=(experts,))
    if style == "flint":  # the sigmoid scores' top_k, no bias
        return GroupedRouting(1, 1, 1.0)
    if style == "laguna":
        return GroupedRouting(1, 1, float(config.moe_routed_scaling_factor),
                              correction=(experts,),
                              logit_softcap=float(config.moe_router_logit_softcapping) or None)
    if style == "cohere2":  # sigmoid: Flint's; softmax: the plain top_k, renormalized
        return GroupedRouting(1, 1, 1.0) if _cohere2_selection(config) == "sigmoid" else None
    if style == "kolibri":
        return GroupedRouting(1, 1, 1.0, correction=(experts,), bias_on_logits=True)
    if style == "ernie":  # ERNIE keeps its bias as [1, experts]
        return GroupedRouting(1, 1, scale, softmax=True, correction=(1, experts), group_top=1)
    if style == "mistral4":
        return GroupedRouting(int(config.n_group or 1), int(config.topk_group or 1), scale,
                              softmax=True)
    if style == "deepseek_v2":
        method = getattr(config, "topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ModelLoadError(f"topk_method {method!r} is not supported (greedy, "
                                 "group_limited_greedy)")
        if method == "greedy":
            return GroupedRouting(1, 1, scale, softmax=True, group_top=1)
        return GroupedRouting(int(config.n_group), int(config.topk_group), scale, softmax=True,
                              group_top=1)
    return GroupedRouting(int(config.n_group), int(config.topk_group), scale,
                          correction=(experts,))


def activation_of(config: Any) -> str:
    """The MLP's activation, as transformers names it (Gemma 2/3 call it hidden_activation,
    Nemotron-H mlp_hidden_act)."""
    name = getattr(config, "hidden_activation", None) or \
        getattr(config, "mlp_hidden_act", None) or getattr(config, "hidden_act", "silu")
    known = UNGATED_ACTIVATIONS if flags_of(config).ungated_mlp else ACTIVATIONS
    if name not in known:
        raise ModelLoadError(f"activation {name!r} is not supported ({', '.join(known)})")
    return name


def rms_norm_eps_of(config: Any) -> float:
    """The epsilon of the model's RMSNorms (Nemotron-H calls it layer_norm_epsilon, LFM2
    norm_eps)."""
    for name in ("rms_norm_eps", "layer_norm_epsilon", "norm_eps"):
        eps = getattr(config, name, None)
        if eps is not None:
            return float(eps)
    raise ModelLoadError("the config gives no RMSNorm epsilon (rms_norm_eps)")


def embedding_multiplier_of(config: Any) -> float | None:
    """What the embeddings are multiplied by, as they are (not rounded to the model dtype):
    Granite's and Falcon-H1's embedding_multiplier (MiniCPM3's scale_emb, _minicpm3_names),
    AFMoE's sqrt(hidden_size) where mup_enabled, XGLM's where scale_embedding; None for any
    other."""
    flags = flags_of(config)
    if flags.granite or flags.falcon_h1:
        return float(config.embedding_multiplier)
    if getattr(config, "model_type", None) == "afmoe" and getattr(config, "mup_enabled", False):
        return config.hidden_size ** 0.5
    if getattr(config, "model_type", None) == XGLM and config.scale_embedding:
        return config.hidden_size ** 0.5
    return None


def sandwich_norms_of(config: Any) -> bool:
    """Whether each branch's output is normalized before it joins the stream (Gemma 2 and 3;
    HyperCLOVA X where use_post_norm)."""
    if flags_of(config).logits_times_scaling:
        return bool(getattr(config, "use_post_norm", False))
    return flags_of(config).sandwich_norms


def layer_window_of(config: Any, layer: int) -> int | None:
    """The sliding window decoder layer `layer` attends over, in tokens (None: the whole
    context). Gemma 2 alternates sliding and full layers, Gemma 3 has five sliding layers to a
    full one, Mistral 7B v0.1 slides in every layer; transformers lists each layer's kind in
    layer_types."""
    window = sliding_window_of(config)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and layer_types[layer] != "sliding_attention"):
        return None
    return window


def attention_chunk_of(config: Any, layer: int) -> int | None:
    """The chunk decoder layer `layer` attends within (Llama 4's chunked_attention layers:
    each query sees its own chunk of attention_chunk_size positions), None for any other."""
    kinds = getattr(config, "layer_types", None) or ()
    if not flags_of(config).llama4 or layer >= len(kinds) or kinds[layer] != "chunked_attention":
        return None
    return int(config.attention_chunk_size)


def rotates_at(config: Any, layer: int) -> bool:
    """Whether decoder layer `layer` turns q and k by their positions: SmolLM3's no_rope_layers
    marks the layers that do (1) and those with no positional encoding at all (0); EXAONE 4's
    full-attention layers do not where it has sliding ones."""
    if getattr(config, "model_type", None) == "cohere2_moe" and \
            config.mlp_layer_types[layer] == "dense" and \
            config.prefix_dense_sliding_window_pattern == 1:
        return True  # Command A+'s first, dense layers: turned, whatever their window
    if flags_of(config).full_layers_nope and getattr(config, "sliding_window", None):
        return layer_window_of(config, layer) is not None
    if flags_of(config).mixer_blocks or kimi_linear(config) or \
            getattr(config, "model_type", None) == "jamba":
        return False  # Nemotron-H's, Kimi Linear's and Jamba's attention: no positions
    if flags_of(config).learned_positions or flags_of(config).alibi:
        return False  # positions embedded with the tokens, or biasing the scores (ALiBi)
    if getattr(config, "model_type", None) == "olmo_hybrid":  # rotary where a base is given
        return bool((getattr(config, "rope_parameters", None) or {}).get("rope_theta"))
    if getattr(config, "model_type", None) == "granitemoehybrid":  # Granite 4.0-H: opt-in
        return getattr(config, "position_embedding_type", None) == "rope"
    thetas = getattr(config, "layer_rope_theta", None)  # Granite SWA's bases (0: none)
    if thetas is not None:
        return bool(thetas[layer])
    marks = getattr(config, "no_rope_layers", None)
    return True if marks is None else bool(marks[layer])


def sliding_window_of(config: Any) -> int | None:
    """The attention window of the model's sliding-window layers, in tokens (None if every
    layer attends to the whole context). Mistral 7B v0.1 slides over 4096 tokens; Qwen2/3
    configs slide only with use_sliding_window (transformers lists each layer's kind in
    layer_types where they differ)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def context_length_of(config: Any) -> int:
    """The longest sequence the model takes: max_position_embeddings (an encoder's less the
    positions its count skips), or for a YaRN-stretched
    model its original context times the factor, where that is longer (Qwen's model cards
    stretch 32K to 128K this way and leave max_position_embeddings as it was; vLLM derives
    the same length)."""
    limit = (getattr(config, "max_position_embeddings", None) or 2048) - position_offset(config)
    params = rope_parameters(config)
    original, factor = params.get("original_max_position_embeddings"), params.get("factor")
    if params["rope_type"] == "yarn" and original and factor:
        limit = max(limit, int(original * factor))
    return limit
