"""Llama's layers with a family's twist, read from the config. Greedy output equals
transformers token for token (batched, chunked, from the prefix cache, under tensor
parallelism) for:
- Granite (`GraniteForCausalLM`, IBM's Granite 3.x): four multipliers (embeddings, attention
  scale, each branch's output as it joins the residual stream, a divisor of the logits); its
  log-probabilities are transformers' too (the divisor changes them, not the greedy choice);
  Granite SWA (`GraniteSWAForCausalLM`): the same with sliding layers, attention sinks and a
  rotary base per layer (layer_rope_theta; 0: no positional encoding);
- NanoChat (`NanoChatForCausalLM`, Karpathy's nanochat): RMSNorms without a weight, one over
  the embeddings too, q and k normed after a rotary turn the other way, an ungated MLP of
  squared ReLU under fc1 and fc2, logits soft-capped;
- SmolLM3 (`SmolLM3ForCausalLM`): every fourth layer with no positional encoding (NoPE);
- Seed-OSS (`SeedOssForCausalLM`): biases on q, k and v but not on the output projection;
- ERNIE 4.5 (`Ernie4_5ForCausalLM`): rotary over interleaved pairs of dimensions, and with
  use_bias a bias on every projection;
- GLM-4 (`Glm4ForCausalLM`): four norms per layer, half of each head turned over interleaved
  pairs, biases on q, k and v only, gate and up stored fused; GLM-4 9B (`GlmForCausalLM`): the
  same with Llama's two norms;
- Arcee (`ArceeForCausalLM`): an MLP without a gate, of squared ReLU;
- Ministral 3 (`Ministral3ForCausalLM`): YaRN, and queries scaled by position past the
  pretraining context (Llama 4's attention temperature);
- Ministral 8B (`MinistralForCausalLM`): sliding and full layers by layer_types;
- Cohere's Command R (`CohereForCausalLM`): LayerNorm, attention and the MLP in parallel off one
  norm, rotary over interleaved pairs, logits times logit_scale; Command R7B and A
  (`Cohere2ForCausalLM`): the same, three sliding layers in four and the full one with no
  positional encoding; Command R+: q and k normalized per head by Cohere's LayerNorm, a weight
  per head (use_qk_norm);
- StarCoder 2 (`Starcoder2ForCausalLM`): LayerNorm with biases, an MLP without a gate (c_fc,
  GeLU, c_proj), biases on every projection, a sliding window in every layer;
- Hunyuan (`HunYuanDenseV1ForCausalLM`): q and k normalized per head after the rotary turn,
  whose base a fixed NTK alpha stretches;
- Nemotron (`NemotronForCausalLM`): LayerNorm with 1 + weight, rotary over half of each head,
  an MLP of squared ReLU without a gate;
- Phi-2 (`PhiForCausalLM`): LayerNorm, attention and the MLP in parallel off one norm, a bias
  on every projection and the LM head, rotary over two fifths of each head; with qk_layernorm
  one LayerNorm over each head of q and k;
- Persimmon (`PersimmonForCausalLM`): GPT-NeoX's fused q, k and v, a LayerNorm (with a bias)
  over each head of q and k, rotary over half of each head, squared ReLU without a gate;
- Helium (`HeliumForCausalLM`): rotary over interleaved pairs, biases on q, k and v only;
  EXAONE 3.5 (`ExaoneForCausalLM`): Llama's layers under GPT-2's names; InternLM3
  (`InternLM3ForCausalLM`): Llama's, with biases where its config asks;
- Apertus (`ApertusForCausalLM`): q and k normalized per head, an MLP without a gate of xIELU,
  whose parameters each layer learns;
- StableLM (`StableLmForCausalLM`): LayerNorm, rotary over a quarter of each head, biases on q,
  k and v, attention and the MLP in sequence or in parallel off one norm; StableLM 2 12B's
  LayerNorm of its own for each head of q and k (qk_layernorm);
- GPT-NeoX (`GPTNeoXForCausalLM`, Pythia): q, k and v fused head by head, rotary over a quarter
  of each head, an MLP of GeLU without a gate, biases everywhere, attention and the MLP in
  parallel off a norm each or in sequence; the causal-mask buffers older checkpoints carry are
  skipped;
- GPT-2 (`GPT2LMHeadModel`), GPT-BigCode (`GPTBigCodeForCausalLM`, one KV head or a KV head
  per query head) and OPT (`OPTForCausalLM`): learned positions (OPT's counted from 2), no
  rotary, LayerNorm, an MLP without a gate, biases everywhere; GPT-2's Conv1D weights stored
  [in, out], under the bare names of its first checkpoints;
- CodeGen (`CodeGenForCausalLM`): GPT-J's layers, q, v and k fused in four blocks of rows,
  one per shard of its training;
- XGLM (`XGLMForCausalLM`): OPT's layers, fixed sinusoidal positions counted from 2, the
  embeddings times sqrt(d_model);
- GPT-Neo (`GPTNeoForCausalLM`): GPT-2's layers with q, k and v apart, scores unscaled, local
  layers sliding over window_size, its checkpoints' causal-mask buffers skipped;
- GPT-J (`GPTJForCausalLM`): rotary over interleaved pairs of the first rotary_dim dimensions
  of each head, attention and the MLP in parallel off one norm, biases on the MLP and the LM
  head only;
- Falcon (`FalconForCausalLM`): q, k and v fused per KV head: one KV head with attention and
  the MLP in parallel off one norm (7B), KV heads of their own each off its own norm (40B,
  180B), or a KV head per query head, in sequence, with biases;
- BLOOM (`BloomForCausalLM`): ALiBi (no rotary; each head's scores biased by distance), a
  LayerNorm over the embeddings, q, k and v fused per head, under the bare names of its first
  checkpoints;
- MPT (`MptForCausalLM`): ALiBi with its own slopes (six heads: past a power of two, in its
  order), LayerNorm without biases, q, k and v fused and clamped, its own softmax scale;
- OLMo (`OlmoForCausalLM`): Llama's layers, LayerNorms without a weight, q, k and v clamped;
- Jais 2 (`Jais2ForCausalLM`): LayerNorm with biases, an MLP of squared ReLU without a gate,
  biases on every projection;
- CWM (`CwmForCausalLM`): Llama 3's stretched rotary, three sliding layers to a full one;
- HyperCLOVA X (`HyperCLOVAXForCausalLM`): Granite's multipliers, logits multiplied by
  logits_scaling, a norm after each branch;
- IQuest-Coder (`IQuestCoderForCausalLM`): Llama's layers under a name of its own."""

from __future__ import annotations

import pytest
import torch
from model_support import (
    greedy_three_ways,
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
    update_config_json,
)

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.models.architecture import rotates_at
from tokenmill.engine.models.loader import build_model
from tokenmill.engine.models.source import ModelLoadError, ModelSource

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
             eos_token_id=2, pad_token_id=0)


def _config(kind: str, vocab: int):
    import transformers

    if kind == "granite":
        # Multipliers far from Llama's implicit ones, so that a missing one shows.
        return transformers.GraniteConfig(
            vocab_size=vocab, tie_word_embeddings=True, embedding_multiplier=6.0,
            attention_multiplier=0.5, residual_multiplier=0.3, logits_scaling=4.0, **SHAPE)
    if kind == "granite_swa":
        # Granite's multipliers (nearer 1 than Granite's above, which damp how much the
        # positions show in the logprobs); sliding layers with a rotary base of their own (not
        # the global one), the full layer without positional encoding; sinks drawn with the
        # norms.
        return transformers.GraniteSWAConfig(
            vocab_size=vocab, tie_word_embeddings=True, embedding_multiplier=2.0,
            attention_multiplier=0.5, residual_multiplier=0.9, logits_scaling=2.0,
            sliding_window=6, layer_rope_theta=[0, 500.0, 500.0, 500.0], **SHAPE)
    if kind == "nanochat":  # a soft cap low enough to bite on a random model's logits
        return transformers.NanoChatConfig(vocab_size=vocab, final_logit_softcapping=2.0,
                                           tie_word_embeddings=False, **SHAPE)
    if kind == "ernie4_5":  # biases on every projection, q's and k's reordered with rows
        return transformers.Ernie4_5Config(vocab_size=vocab, head_dim=16, use_bias=True,
                                           tie_word_embeddings=False, **SHAPE)
    if kind == "glm4":  # half of each head rotates, over interleaved pairs; four norms
        return transformers.Glm4Config(vocab_size=vocab, head_dim=16, attention_bias=True,
                                       tie_word_embeddings=False, **SHAPE)
    if kind == "glm":  # GLM-4's rotary and fused MLP, two norms per layer
        return transformers.GlmConfig(vocab_size=vocab, head_dim=16, attention_bias=True,
                                      tie_word_embeddings=False, **SHAPE)
    if kind == "arcee":  # an MLP without a gate, of squared ReLU
        return transformers.ArceeConfig(vocab_size=vocab, tie_word_embeddings=False, **SHAPE)
    if kind == "ministral3":  # a short pretraining context, so that the prompts pass it
        return transformers.Ministral3Config(
            vocab_size=vocab, head_dim=16, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                             "original_max_position_embeddings": 4, "beta_fast": 32.0,
                             "beta_slow": 1.0, "llama_4_scaling_beta": 0.5}, **SHAPE)
    if kind == "ministral":
        return transformers.MinistralConfig(
            vocab_size=vocab, head_dim=16, sliding_window=6, tie_word_embeddings=False,
            layer_types=["sliding_attention", "full_attention"] * 2, **SHAPE)
    if kind == "cohere":  # biases on every projection, reordered with q's and k's rows
        return transformers.CohereConfig(vocab_size=vocab, logit_scale=0.5, attention_bias=True,
                                         **SHAPE)
    if kind == "cohere-qk_norm":  # Command R+: q and k normalized per head, a weight each
        return transformers.CohereConfig(vocab_size=vocab, logit_scale=0.5, use_qk_norm=True,
                                         **SHAPE)
    if kind == "persimmon":  # q and k through a LayerNorm per head; rotary over half of each
        shape = {k: v for k, v in SHAPE.items() if k != "num_key_value_heads"}
        return transformers.PersimmonConfig(vocab_size=vocab, tie_word_embeddings=False,
                                            **shape)
    if kind == "cohere2":
        return transformers.Cohere2Config(vocab_size=vocab, logit_scale=0.5, sliding_window=6,
                                          head_dim=16, **SHAPE)
    if kind == "starcoder2":
        return transformers.Starcoder2Config(vocab_size=vocab, sliding_window=6, use_bias=True,
                                             tie_word_embeddings=False, **SHAPE)
    if kind == "nemotron":  # LayerNorm1P, rotary over half of each head, squared ReLU
        return transformers.NemotronConfig(vocab_size=vocab, head_dim=16, **SHAPE)
    if kind == "phi":  # LayerNorm, parallel branches, biases everywhere, rotary on 2/5
        return transformers.PhiConfig(vocab_size=vocab, partial_rotary_factor=0.4,
                                      hidden_act="gelu_new", **SHAPE)
    if kind == "helium":  # rotary over interleaved pairs, biases on q, k and v only
        return transformers.HeliumConfig(vocab_size=vocab, head_dim=16, attention_bias=True,
                                         **SHAPE)
    if kind == "exaone":  # Llama under GPT-2's names
        return transformers.ExaoneConfig(vocab_size=vocab, **SHAPE)
    if kind == "internlm3":  # biases on every projection (qkv_bias and bias)
        return transformers.InternLM3Config(vocab_size=vocab, qkv_bias=True, bias=True,
                                            **SHAPE)
    if kind == "apertus":  # q and k normalized per head, an ungated MLP of xIELU
        return transformers.ApertusConfig(vocab_size=vocab, head_dim=16, **SHAPE)
    if kind in ("stablelm", "stablelm-parallel"):  # LayerNorm, rotary on a quarter, q/k/v bias
        return transformers.StableLmConfig(
            vocab_size=vocab, use_qkv_bias=True, partial_rotary_factor=0.25,
            use_parallel_residual=kind == "stablelm-parallel", **SHAPE)
    if kind == "stablelm-qk_layernorm":  # StableLM 2 12B: a LayerNorm per head of q and k
        return transformers.StableLmConfig(
            vocab_size=vocab, partial_rotary_factor=0.25, qk_layernorm=True,
            use_parallel_residual=True, **SHAPE)
    if kind == "phi-qk_layernorm":  # one LayerNorm (with a bias) over every head of q and k
        return transformers.PhiConfig(vocab_size=vocab, partial_rotary_factor=0.4,
                                      hidden_act="gelu_new", qk_layernorm=True, **SHAPE)
    if kind in ("gpt_neox", "gpt_neox-sequential"):  # Pythia's config keys (rotary_pct)
        shape = {k: v for k, v in SHAPE.items() if k != "num_key_value_heads"}
        return transformers.GPTNeoXConfig(
            vocab_size=vocab, rotary_pct=0.25, rotary_emb_base=5000,
            use_parallel_residual=kind == "gpt_neox", **shape)
    if kind in ("gpt2", "gpt_bigcode", "gpt_bigcode-mha"):
        gpt2 = dict(vocab_size=vocab, n_embd=64, n_layer=4, n_head=4, n_inner=128,
                    n_positions=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        if kind == "gpt2":
            return transformers.GPT2Config(**gpt2)
        return transformers.GPTBigCodeConfig(multi_query=kind == "gpt_bigcode", **gpt2)
    if kind == "gptj":  # half of each head rotates
        return transformers.GPTJConfig(vocab_size=vocab, n_embd=64, n_layer=4, n_head=4,
                                       rotary_dim=8, n_inner=128, n_positions=512,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "codegen":  # GPT-J's layers; eight heads, two in each training shard's block
        return transformers.CodeGenConfig(vocab_size=vocab, n_embd=64, n_layer=4, n_head=8,
                                          rotary_dim=4, n_inner=128, n_positions=512,
                                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind.startswith("falcon"):
        layout = {"falcon": dict(multi_query=True, parallel_attn=True),
                  "falcon-new": dict(new_decoder_architecture=True, num_kv_heads=2),
                  "falcon-sequential": dict(multi_query=False, parallel_attn=False,
                                            bias=True)}[kind]
        return transformers.FalconConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=4,
                                         num_attention_heads=4, ffn_hidden_size=128,
                                         max_position_embeddings=512, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0, **layout)
    if kind == "bloom":  # six heads: ALiBi's slopes past the largest power of two
        return transformers.BloomConfig(vocab_size=vocab, hidden_size=96, n_layer=4, n_head=6,
                                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "mpt":
        return transformers.MptConfig(
            vocab_size=vocab, d_model=96, n_heads=6, n_layers=4,
            max_seq_len=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            attn_config={"clip_qkv": 1.5, "softmax_scale": 0.4})
    if kind == "olmo":  # clamped tightly enough that the clamp bites
        return transformers.OlmoConfig(vocab_size=vocab, clip_qkv=0.3, **SHAPE)
    if kind == "xglm":  # fixed sinusoidal positions counted from 2, embeddings scaled
        return transformers.XGLMConfig(vocab_size=vocab, d_model=64, ffn_dim=128, num_layers=4,
                                       attention_heads=4, max_position_embeddings=512,
                                       scale_embedding=True, bos_token_id=0, eos_token_id=2,
                                       pad_token_id=1)
    if kind == "gpt_neo":  # local layers sliding over a window short enough to bite
        return transformers.GPTNeoConfig(
            vocab_size=vocab, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128,
            max_position_embeddings=512, window_size=6,
            attention_types=[[["global", "local"], 2]], bos_token_id=1, eos_token_id=2)
    if kind == "opt":
        return transformers.OPTConfig(vocab_size=vocab, hidden_size=64, ffn_dim=128,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      max_position_embeddings=512, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
    if kind == "hunyuan":
        return transformers.HunYuanDenseV1Config(
            vocab_size=vocab, head_dim=16, tie_word_embeddings=False,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 50.0,
                             "factor": 1.0},
            **SHAPE)
    if kind == "hyperclovax":  # Granite's multipliers, logits multiplied, a norm after each
        # branch
        return transformers.HyperCLOVAXConfig(
            vocab_size=vocab, tie_word_embeddings=False, embedding_multiplier=3.0,
            attention_multiplier=0.4, residual_multiplier=0.5, logits_scaling=0.25,
            use_post_norm=True, **SHAPE)
    if kind == "jais2":  # LayerNorm, squared ReLU without a gate, biases everywhere
        return transformers.Jais2Config(vocab_size=vocab, head_dim=16, attention_bias=True,
                                        mlp_bias=True, tie_word_embeddings=False, **SHAPE)
    if kind == "cwm":  # Llama 3's stretched rotary, a full layer to three sliding ones
        return transformers.CwmConfig(vocab_size=vocab, head_dim=16, sliding_window=6,
                                      tie_word_embeddings=False, **SHAPE)
    if kind == "iquestcoder":  # Llama's layers under an architecture of its own
        return transformers.IQuestCoderConfig(vocab_size=vocab, head_dim=16, **SHAPE)
    if kind == "seed_oss":
        return transformers.SeedOssConfig(vocab_size=vocab, head_dim=16, attention_bias=True,
                                          attention_out_bias=False, **SHAPE)
    return transformers.SmolLM3Config(vocab_size=vocab, rope_theta=5e6, **SHAPE)


@pytest.fixture(scope="module",
                params=["granite", "granite_swa", "nanochat", "smollm3", "seed_oss", "ernie4_5",
                        "glm4", "glm", "arcee", "ministral3", "ministral", "cohere", "cohere2",
                        "starcoder2", "hunyuan", "nemotron", "phi", "helium", "exaone", "internlm3",
                        "apertus", "stablelm", "stablelm-parallel", "gpt_neox",
                        "gpt_neox-sequential", "gpt2", "gpt_bigcode", "gpt_bigcode-mha", "opt",
                        "gptj", "falcon", "falcon-new", "falcon-sequential", "bloom", "mpt",
                        "olmo", "jais2", "cwm", "hyperclovax", "iquestcoder", "cohere-qk_norm",
                        "persimmon", "stablelm-qk_layernorm", "phi-qk_layernorm", "gpt_neo",
                        "codegen", "xglm"])
def variant_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    # Biases and norms drawn (but for the families that have none or keep Llama's), so that a
    # missing (or misplaced) one shows.
    directory = make_random_model(
        str(tmp_path_factory.mktemp(request.param)), _config(request.param, len(vocab_tokenizer)),
        vocab_tokenizer, draw_norms=request.param not in ("granite", "smollm3", "arcee",
                                                          "ministral3", "ministral", "exaone"))
    if request.param in ("gpt_neox", "gpt2", "bloom", "mpt", "iquestcoder", "gpt_neo"):
        _as_first_published(directory, request.param)
    return directory


# The architectures published checkpoints name for their remote code (transformers saves
# IQuest-Coder's as Llama's).
REMOTE_CODE_ARCHITECTURES = {"mpt": "MPTForCausalLM", "iquestcoder": "IQuestCoderForCausalLM"}
# Where Pythia's and GPT-2's published checkpoints keep each layer's causal-mask buffers.
CAUSAL_MASK_BUFFERS = {"gpt_neox": "gpt_neox.layers.{}.attention", "gpt2": "transformer.h.{}.attn",
                       "gpt_neo": "transformer.h.{}.attn.attention"}


def _as_first_published(directory: str, kind: str) -> None:
    """The checkpoint as Pythia's, GPT-2's, GPT-Neo's, BLOOM's and MPT's were published: the
    causal-mask buffers beside each layer's weights (Pythia's, GPT-2's and GPT-Neo's); GPT-2's
    and BLOOM's saved from their bare decoders, every name without `transformer.`; MPT's and
    IQuest-Coder's architecture named as their remote code spells it."""
    from safetensors.torch import load_file, save_file

    if kind in REMOTE_CODE_ARCHITECTURES:
        update_config_json(directory, architectures=[REMOTE_CODE_ARCHITECTURES[kind]])
        return

    path = f"{directory}/model.safetensors"
    tensors = load_file(path)
    attention = CAUSAL_MASK_BUFFERS.get(kind)
    for layer in range(SHAPE["num_hidden_layers"]) if attention else ():
        prefix = attention.format(layer)
        tensors[f"{prefix}.bias"] = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
        tensors[f"{prefix}.masked_bias"] = torch.tensor(-1e9)
        if kind == "gpt_neox":
            tensors[f"{prefix}.rotary_emb.inv_freq"] = torch.ones(2)
    if kind in ("gpt2", "bloom"):
        tensors = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def reference(variant_dir):
    return hf_reference(variant_dir)


@pytest.fixture(scope="module")
def expected(reference, vocab_tokenizer) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


@pytest.fixture(scope="module")
def served(variant_dir, vocab_tokenizer):
    """One engine's greedy runs (batched, again from the prefix cache, alone) and its top
    log-probabilities of the last prompt's next token."""
    with LLM(variant_dir, **ENGINE) as llm:
        runs = greedy_three_ways(llm, mixed_prompts(vocab_tokenizer), MAX_NEW)
        params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=3)
        logprobs = llm.generate([mixed_prompts(vocab_tokenizer)[-1]],
                                params)[0].outputs[0].logprobs[0]
    return runs, logprobs


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(served, expected):
    runs, _ = served
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


# Families whose layers split over ranks exactly as another family's here do (Llama's, with
# biases as Seed-OSS's and ERNIE's, LayerNorm and an ungated MLP as StarCoder 2's, GLM-4's
# rotary over interleaved pairs, one KV head for all as GPT-BigCode's, ALiBi's slopes as
# BLOOM's, Command R's as Command R+'s with its norms; q, k and v read out of a fused tensor
# before they are split): their tensor-parallel runs would repeat those.
SHARDED_AS_ANOTHER = ("glm", "helium", "cohere", "exaone", "internlm3", "nemotron", "stablelm",
                      "stablelm-parallel", "gpt_neox", "gpt_neox-sequential",
                      "gpt_bigcode-mha", "opt", "falcon", "falcon-sequential", "olmo", "mpt",
                      "gptj", "smollm3", "seed_oss", "arcee", "ministral", "cohere2",
                      "hunyuan", "cwm", "jais2", "hyperclovax", "iquestcoder", "persimmon",
                      "phi-qk_layernorm", "gpt_neo", "codegen", "xglm")


def test_tensor_parallel_equals_hf(request, variant_dir, expected, vocab_tokenizer):
    if request.node.callspec.params["variant_dir"] in SHARDED_AS_ANOTHER:
        pytest.skip("splits as another family here does (SHARDED_AS_ANOTHER)")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(variant_dir, tensor_parallel_size=2, **ENGINE) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(mixed_prompts(vocab_tokenizer),
                                                              params)]
    assert got == expected


@pytest.fixture(scope="module")
def granite_dir(tmp_path_factory, vocab_tokenizer) -> str:
    return make_random_model(str(tmp_path_factory.mktemp("granite-logprobs")),
                             _config("granite", len(vocab_tokenizer)), vocab_tokenizer)


def test_logprobs_are_transformers(served, reference, vocab_tokenizer):
    """Closer than greedy equality: a random model's argmax barely depends on its positions,
    so a rotary turned the wrong way (ERNIE's pairs) or a missing multiplier (Granite's logits
    divisor) shows here first."""
    prompt = mixed_prompts(vocab_tokenizer)[-1]
    with torch.no_grad():
        logits = reference(torch.tensor([prompt])).logits[0, -1].float()
    want = torch.log_softmax(logits, -1)
    got = served[1]
    assert set(got) == set(want.topk(3).indices.tolist())
    for token, logprob in got.items():
        assert abs(logprob - want[token].item()) < 1e-4


def test_a_granite_gguf_is_refused_by_name(granite_dir):
    from transformers import AutoConfig

    source = ModelSource(directory=granite_dir, gguf_file="granite-3.3-8b-instruct-Q4_K_M.gguf")
    with pytest.raises(ModelLoadError, match="Q4_K_M.gguf holds a Granite model"):
        build_model(AutoConfig.from_pretrained(granite_dir), source, 64, torch.float32,
                    torch.device("cpu"))


def test_smollm3s_every_fourth_layer_has_no_positional_encoding():
    assert [rotates_at(_config("smollm3", 100), i) for i in range(4)] == [True, True, True,
                                                                           False]


def test_granite_swa_layers_of_one_kind_with_two_rotary_bases_are_refused():
    """One rotary table a kind of layer: two bases among the sliding layers is refused at
    load, naming the field; the full layer's 0 is no positional encoding."""
    from tokenmill.engine.models.architecture import check_features

    config = _config("granite_swa", 100)
    assert [rotates_at(config, i) for i in range(4)] == [False, True, True, True]
    config.layer_rope_theta = [0, 500.0, 800.0, 500.0]
    with pytest.raises(ModelLoadError, match=r"layer_rope_theta gives the sliding_attention "
                                             r"layers several rotary bases \(\[500.0, 800.0\]\)"):
        check_features(config)


def test_lora_on_an_mlp_without_a_gate_is_refused_by_name(tmp_path, vocab_tokenizer):
    path = make_random_model(str(tmp_path), _config("arcee", len(vocab_tokenizer)),
                             vocab_tokenizer)
    with pytest.raises(ConfigError, match="enable_lora: LoRA adapters are not served on "
                                          "ArceeForCausalLM's MLP without a gate"):
        LLM(path, enable_lora=True, **ENGINE)


@pytest.mark.parametrize("kind", ["ernie4_5", "glm4", "cohere"])
def test_a_lora_adapter_on_rotary_pairs_equals_peft(tmp_path, vocab_tokenizer, kind):
    """Families that rotate adjacent pairs have q's and k's rows reordered at load (GLM-4's
    over the rotated part of each head only): an adapter's B rows on q_proj and k_proj are
    reordered alike, so its update lands on the rows it was trained for."""
    from lora_support import Adapter, make_adapter, peft_greedy

    from tokenmill.engine import LoRARequest, SamplingParams

    base = make_random_model(str(tmp_path / "base"), _config(kind, len(vocab_tokenizer)),
                             vocab_tokenizer)
    adapter = make_adapter(base, str(tmp_path / "adapter"),
                           Adapter("pairs", 4, 8, ["q_proj", "k_proj"]))
    prompts = [vocab_tokenizer.encode(t) for t in ("The quick brown fox", "one two three")]
    expected = peft_greedy(base, adapter, prompts, 6)
    assert expected != peft_greedy(base, None, prompts, 6)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(base, enable_lora=True, max_lora_rank=4, show_progress=False,
             dtype="float32") as llm:
        outputs = llm.generate(prompts, params, lora_request=LoRARequest("pairs", 1, adapter))
    assert [o.outputs[0].token_ids for o in outputs] == expected


@pytest.mark.parametrize("kind, field, value, message", [
    ("opt", "do_layer_norm_before", False, "do_layer_norm_before false .*OPT-350m"),
    ("opt", "word_embed_proj_dim", 32, "word_embed_proj_dim 32 .*not supported"),
    ("gpt2", "scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx"),
    ("gpt_bigcode", "scale_attn_weights", False, "scale_attn_weights false"),
    ("falcon", "alibi", True, "alibi .*Falcon-RW"),
    ("mpt", "logit_scale", 0.5, "logit_scale 0.5 is not supported")])
def test_layers_beyond_the_released_ones_are_refused_by_name(tmp_path, vocab_tokenizer, kind,
                                                             field, value, message):
    """OPT-350m's post-norms and narrower embeddings, GPT-2's scores scaled by layer or left
    unscaled, Falcon-RW's ALiBi: refused at load rather than served as the other layers."""
    config = _config(kind, len(vocab_tokenizer))
    setattr(config, field, value)
    config.save_pretrained(str(tmp_path))
    vocab_tokenizer.save_pretrained(str(tmp_path))
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(tmp_path), **ENGINE)
