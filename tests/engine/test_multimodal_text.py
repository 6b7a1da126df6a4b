"""The language model of a multimodal checkpoint (Gemma 3 4B-27B, Gemma 4, Mistral Small 3.1 and 4,
Ministral 3, LLaVA, LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) served text-only:
greedy output equals transformers' multimodal model on the same text token for token, from
either weight layout (and either layout of Qwen3-VL-MoE's experts), with the head tied or not
as transformers decides; the other towers are not read; what cannot be served is refused by
name."""

from __future__ import annotations

import json
import os

import pytest
import torch
from deepseek_support import deepseek_config
from gemma4_support import gemma4_config
from model_support import (
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
    update_config_json,
)
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.architecture import architecture_of
from tokenmill.engine.models.loader import load_config
from tokenmill.engine.models.multimodal import language_model_weight
from tokenmill.engine.models.source import ModelLoadError, ModelSource

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)


def _config(kind: str, vocab: int):
    import transformers

    text = dict(TEXT, vocab_size=vocab)
    image = vocab - 1
    if kind == "gemma3":
        return transformers.Gemma3Config(
            text_config=dict(text, model_type="gemma3_text", sliding_window=16,
                             query_pre_attn_scalar=24,
                             layer_types=["sliding_attention", "full_attention",
                                          "sliding_attention"]),
            vision_config=VISION, mm_tokens_per_image=4, image_token_index=image,
            boi_token_index=image - 2, eoi_token_index=image - 1)
    if kind in ("mistral3", "ministral3"):  # Mistral Small 3.1; Ministral 3 (YaRN, Llama 4's
        # query scale past a short pretraining context)
        rope = {} if kind == "mistral3" else dict(rope_parameters={
            "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
            "original_max_position_embeddings": 4, "llama_4_scaling_beta": 0.5})
        return transformers.Mistral3Config(
            text_config=dict(text, model_type="mistral" if kind == "mistral3" else kind,
                             **rope),
            vision_config=dict(VISION, head_dim=16), image_token_index=image)
    if kind == "gemma4":  # two head sizes, values from the keys on the full layers
        return transformers.Gemma4Config(
            text_config=gemma4_config(vocab).to_dict(), audio_config=None,
            vision_config=dict(VISION, num_key_value_heads=2, head_dim=16),
            image_token_id=image)
    if kind == "mistral4":  # Mistral Small 4: DeepSeek-V3's layers, experts stacked per layer
        return transformers.Mistral3Config(
            text_config=deepseek_config("mistral4", vocab).to_dict(),
            vision_config=dict(VISION, head_dim=16), image_token_index=image)
    qwen_vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                       out_hidden_size=TEXT["hidden_size"])
    qwen_tokens = dict(image_token_id=image, video_token_id=image - 1,
                       vision_start_token_id=image - 2)
    if kind == "qwen2_vl":
        return transformers.Qwen2VLConfig(
            text_config=dict(text, rope_theta=1e6,
                             rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
            vision_config=dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2,
                               hidden_size=TEXT["hidden_size"]), **qwen_tokens)
    if kind == "qwen2_5_vl":  # q/k/v biases; saved as a causal model's names beside visual.*
        return transformers.Qwen2_5_VLConfig(
            text_config=dict(text, rope_theta=1e6,
                             rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
            vision_config=dict(qwen_vision, fullatt_block_indexes=[0]), **qwen_tokens)
    if kind == "qwen3_vl":  # QK-norm, interleaved sections, deep-stacked vision features
        return transformers.Qwen3VLConfig(
            text_config=dict(text, rope_theta=5e5,
                             rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3],
                                           "mrope_interleaved": True}),
            vision_config=dict(qwen_vision, deepstack_visual_indexes=[0]), **qwen_tokens)
    if kind == "qwen3_vl_moe":  # Qwen3-VL over experts (gate and up square: [4, 64, 64])
        return transformers.Qwen3VLMoeConfig(
            text_config=dict(text, rope_theta=5e5, num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, decoder_sparse_step=1,
                             rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3],
                                           "mrope_interleaved": True}),
            vision_config=dict(qwen_vision, deepstack_visual_indexes=[0]), **qwen_tokens)
    vision = dict(VISION, model_type="clip_vision_model", projection_dim=32)
    if kind == "llava":
        return transformers.LlavaConfig(text_config=dict(text, model_type="llama"),
                                        vision_config=vision, image_token_index=image)
    return transformers.LlavaNextConfig(text_config=dict(text, model_type="qwen2"),
                                        vision_config=vision, image_token_index=image,
                                        image_grid_pinpoints=[[28, 28]])


def _make(directory: str, config, tokenizer) -> str:
    """A random-weight multimodal checkpoint, saved by transformers (every weight drawn)."""
    return make_random_model(directory, config, tokenizer, draw_norms=True,
                             auto_class="AutoModelForImageTextToText")


def _expected(directory: str, prompts: list[list[int]]) -> list[list[int]]:
    model = hf_reference(directory, "AutoModelForImageTextToText", attn_implementation="eager")
    return [hf_greedy(model, p, MAX_NEW) for p in prompts]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _weights(directory: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(directory, "model.safetensors"))


@pytest.fixture(scope="module", params=["gemma3", "gemma4", "mistral3", "ministral3",
                                        "mistral4", "llava", "llava_next",
                                        "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def multimodal_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    directory = str(tmp_path_factory.mktemp(request.param))
    return _make(directory, _config(request.param, len(vocab_tokenizer)), vocab_tokenizer)


def test_greedy_equals_the_multimodal_model_on_text(multimodal_dir, vocab_tokenizer):
    prompts = mixed_prompts(vocab_tokenizer)
    stored = _weights(multimodal_dir)
    assert any(language_model_weight(name) is None for name in stored)  # a vision tower
    with LLM(multimodal_dir, **ENGINE) as llm:
        batched = _greedy(llm, prompts)
        hits = llm.engine.kv.prefix_hits
        again = _greedy(llm, prompts)
        assert llm.engine.kv.prefix_hits > hits
        llm.engine.kv.allocator.check_all_free()
    expected = _expected(multimodal_dir, prompts)
    assert batched == expected
    assert again == expected


def test_the_layout_transformers_saves_since_4_52_loads_the_same(tmp_path, vocab_tokenizer):
    """`model.language_model.*`, `model.vision_tower.*`, `lm_head.*` instead of the first
    published `language_model.model.*`, `vision_tower.*`, `language_model.lm_head.*`."""
    directory = _make(str(tmp_path / "m"), _config("llava", len(vocab_tokenizer)),
                      vocab_tokenizer)
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    expected = _expected(directory, prompts)
    renamed = {}
    for name, tensor in _weights(directory).items():
        if name.startswith("language_model.lm_head."):
            name = name.removeprefix("language_model.")
        elif name.startswith("language_model.model."):
            name = "model.language_model." + name.removeprefix("language_model.model.")
        else:
            name = "model." + name
        renamed[name] = tensor
    assert "lm_head.weight" in renamed
    save_file(renamed, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    assert _expected(directory, prompts) == expected  # transformers reads it as the same model
    with LLM(directory, **ENGINE) as llm:
        assert _greedy(llm, prompts) == expected


def test_a_head_the_checkpoint_holds_is_kept_though_the_config_ties(tmp_path, vocab_tokenizer):
    """transformers 5 reads the tie from the outer config, whose default ties Mistral 3's head;
    a checkpoint holding a head unlike the embeddings keeps it (as transformers does)."""
    config = _config("mistral3", len(vocab_tokenizer))
    config.tie_word_embeddings = False
    directory = _make(str(tmp_path / "m"), config, vocab_tokenizer)
    stored = _weights(directory)
    assert not torch.equal(stored["language_model.lm_head.weight"],
                           stored["language_model.model.embed_tokens.weight"])
    update_config_json(directory, tie_word_embeddings=True)
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    with LLM(directory, **ENGINE) as llm:
        got = _greedy(llm, prompts)
        assert llm.engine.runner.model.lm_head.weight is not (
            llm.engine.runner.model.model.embed_tokens.weight)
    assert got == _expected(directory, prompts)


def test_tensor_parallel_serves_the_language_model(tmp_path, vocab_tokenizer):
    directory = _make(str(tmp_path / "m"), _config("gemma3", len(vocab_tokenizer)),
                      vocab_tokenizer)
    prompts = mixed_prompts(vocab_tokenizer)
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        got = _greedy(llm, prompts)
    assert got == _expected(directory, prompts)


def test_the_text_config_is_the_one_served(multimodal_dir):
    config = load_config(ModelSource(directory=multimodal_dir))
    assert architecture_of(config).endswith("ForCausalLM")
    assert config.hidden_size == TEXT["hidden_size"]  # the text model's, not the vision tower's


def test_a_language_model_tokenmill_does_not_run_is_refused_by_name(tmp_path, vocab_tokenizer):
    import transformers

    config = transformers.LlavaConfig(
        text_config=dict(TEXT, vocab_size=len(vocab_tokenizer), model_type="rwkv"),
        vision_config=dict(VISION, model_type="clip_vision_model"))
    directory = str(tmp_path / "m")
    config.architectures = ["LlavaForConditionalGeneration"]
    config.save_pretrained(directory)
    with pytest.raises(ModelLoadError, match="LlavaForConditionalGeneration.*'rwkv'"):
        load_config(ModelSource(directory=directory))


def test_a_multimodal_model_whose_prompt_attends_both_ways_is_refused():
    """PaliGemma attends over its whole prompt at once: its text model is not causal."""
    import transformers

    config = transformers.PaliGemmaConfig(architectures=["PaliGemmaForConditionalGeneration"])
    with pytest.raises(ModelLoadError, match="PaliGemmaForConditionalGeneration.*multimodal"):
        architecture_of(config)


def test_weight_names_of_either_layout():
    assert language_model_weight("language_model.model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight")
    assert language_model_weight("model.language_model.norm.weight") == "model.norm.weight"
    assert language_model_weight("language_model.lm_head.weight") == "lm_head.weight"
    assert language_model_weight("lm_head.weight") == "lm_head.weight"
    assert language_model_weight("model.layers.1.mlp.up_proj.weight") == (
        "model.layers.1.mlp.up_proj.weight")  # Qwen2.5-VL's
    for other in ("vision_tower.encoder.layers.0.mlp.fc1.weight",
                  "model.vision_tower.patch_conv.weight",
                  "multi_modal_projector.linear_1.weight", "image_newline",
                  "visual.blocks.0.attn.qkv.weight", "model.visual.merger.norm.weight"):
        assert language_model_weight(other) is None


def test_a_lora_adapter_of_the_multimodal_model_equals_peft(tmp_path, vocab_tokenizer):
    """PEFT names the language model's modules under the multimodal model's names, and adapts
    the vision tower's projections of the same names too: those never run on text."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForImageTextToText

    directory = _make(str(tmp_path / "m"), _config("gemma3", len(vocab_tokenizer)),
                      vocab_tokenizer)
    base = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8,
                                            target_modules=["q_proj", "v_proj", "up_proj"]))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.15)
    adapter = str(tmp_path / "adapter")
    model.save_pretrained(adapter)
    stored = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    assert any("vision_tower" in name for name in stored)
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    reference = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"), adapter).eval()
    reference.generation_config.eos_token_id = None
    want = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    assert want != _expected(directory, prompts)  # the adapter changes the output
    with LLM(directory, enable_lora=True, max_lora_rank=4, lora_modules=(f"a={adapter}",),
             **ENGINE) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora="a")]
    assert got == want


def test_the_processors_chat_template_is_the_chat_template(tmp_path, vocab_tokenizer):
    """LLaVA's and Mistral 3's repositories keep the template in chat_template.json, for the
    processor: AutoTokenizer alone would leave the model without one."""
    directory = _make(str(tmp_path / "m"), _config("llava", len(vocab_tokenizer)),
                      vocab_tokenizer)
    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    for name in os.listdir(directory):
        if name.startswith("chat_template"):
            os.remove(os.path.join(directory, name))
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        settings = json.load(f)
    settings.pop("chat_template", None)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(settings, f)
    with open(os.path.join(directory, "chat_template.json"), "w") as f:
        json.dump({"chat_template": template}, f)
    messages = [{"role": "user", "content": "hi"}]
    with LLM(directory, **ENGINE) as llm:
        ids = llm.apply_chat_template(messages)
    assert ids == vocab_tokenizer.encode("<user>hi<assistant>", add_special_tokens=False)


def test_qwen3_vl_moe_experts_load_as_first_published(tmp_path, vocab_tokenizer):
    """Qwen3-VL-MoE's experts as its checkpoints were first published, [experts, in, out]
    (transformers 5 saves them [experts, out, in]), read the same; where the shape is square
    the transformers version that saved the checkpoint tells which."""
    directory = _make(str(tmp_path / "m"), _config("qwen3_vl_moe", len(vocab_tokenizer)),
                      vocab_tokenizer)
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    expected = _expected(directory, prompts)
    weights = _weights(directory)
    experts = [name for name in weights if name.endswith(("experts.gate_up_proj",
                                                          "experts.down_proj"))]
    assert experts and any(weights[n].shape[1] == weights[n].shape[2] for n in experts)
    for name in experts:
        weights[name] = weights[name].transpose(1, 2).contiguous()
    save_file(weights, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    update_config_json(directory, transformers_version="4.57.0")
    with LLM(directory, **ENGINE) as llm:
        assert _greedy(llm, prompts) == expected
