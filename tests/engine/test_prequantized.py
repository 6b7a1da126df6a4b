"""Checkpoints published already quantized: FP8 weights with their scales (transformers'
fine-grained FP8, per block; its static scheme, one scale a tensor, as Mistral publishes
Ministral 3; compressed-tensors, per output channel) are dequantized at load,
and greedy output equals transformers' on the same dequantized weights, whole or requantized
to 8 bits; a format the engine does not read is refused by name before any weight is."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from model_support import REFERENCE, hf_greedy, make_random_model, mixed_prompts
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.prequantized import dequantize_fp8
from tokenmill.engine.models.source import ModelLoadError

FP8_MAX = 448.0  # float8_e4m3fn's largest value
BLOCK = (48, 32)  # does not divide the 64- and 128-wide projections: edge blocks are partial
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SETTINGS = {
    "block": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
              "weight_block_size": list(BLOCK)},
    "channel": {"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "type": "float", "num_bits": 8, "strategy": "channel"}}},
                "ignore": ["lm_head"]},
    "tensor": {"quant_method": "fp8", "activation_scheme": "static", "dequantize": False,
               "weight_block_size": None},
}


def _quantize(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 values, scales) of a weight, as the checkpoint format stores them."""
    rows, columns = weight.shape
    if kind == "channel":
        scale = weight.abs().amax(dim=1, keepdim=True) / FP8_MAX
        return (weight / scale).to(torch.float8_e4m3fn), scale
    if kind == "tensor":
        scale = weight.abs().max() / FP8_MAX
        return (weight / scale).to(torch.float8_e4m3fn), scale
    grid = (-(-rows // BLOCK[0]), -(-columns // BLOCK[1]))
    scale = torch.empty(grid)
    for i in range(grid[0]):
        for j in range(grid[1]):
            tile = weight[i * BLOCK[0]:(i + 1) * BLOCK[0], j * BLOCK[1]:(j + 1) * BLOCK[1]]
            scale[i, j] = tile.abs().max() / FP8_MAX
    tiled = scale.repeat_interleave(BLOCK[0], 0)[:rows].repeat_interleave(BLOCK[1], 1)
    return (weight / tiled[:, :columns]).to(torch.float8_e4m3fn), scale


def _fp8_pair(directory: str, out: str, kind: str) -> tuple[str, str]:
    """An FP8 copy of `directory`'s model in `out`, and `directory` rewritten with exactly the
    weights that copy holds (its FP8 values times their scales): what transformers reads."""
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    packed = {}
    for name, weight in list(tensors.items()):
        if name.rpartition(".")[0].rpartition(".")[2] not in PROJECTIONS:
            continue
        values, scale = _quantize(weight, kind)
        tiled = scale if kind in ("channel", "tensor") else scale.repeat_interleave(
            BLOCK[0], 0)[:weight.shape[0]].repeat_interleave(BLOCK[1], 1)[:, :weight.shape[1]]
        tensors[name] = values.float() * tiled
        packed[name] = values
        suffix = "weight_scale" if kind == "channel" else "weight_scale_inv"
        packed[f"{name.rpartition('.')[0]}.{suffix}"] = scale
        if kind == "channel":  # a static activation scale, which the engine does not need
            packed[f"{name.rpartition('.')[0]}.input_scale"] = torch.ones(1)
        if kind == "tensor":  # transformers' name for it
            packed[f"{name.rpartition('.')[0]}.activation_scale"] = torch.ones(())
        if name.endswith("k_proj.weight"):  # and a KV-cache scale
            packed[name.replace("k_proj.weight", "k_scale")] = torch.ones(())
    save_file(tensors, path, metadata={"format": "pt"})
    shutil.copytree(directory, out, ignore=shutil.ignore_patterns("model.safetensors",
                                                                  "config.json"))
    save_file({**tensors, **packed}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**config, "quantization_config": SETTINGS[kind]}, f)
    return out, directory


def _llama(directory: str, tokenizer) -> str:
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False)
    return make_random_model(directory, config, tokenizer)


@pytest.mark.parametrize("kind", ["block", "channel", "tensor"])
def test_fp8_checkpoints_equal_their_dequantized_weights(tmp_path, vocab_tokenizer, kind):
    from transformers import AutoModelForCausalLM

    fp8, plain = _fp8_pair(_llama(str(tmp_path / "plain"), vocab_tokenizer),
                           str(tmp_path / "fp8"), kind)
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32)
    expected = [hf_greedy(model, p, 8) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    with LLM(fp8, show_progress=False, kv_cache_memory=16 << 20, **REFERENCE) as llm:
        assert llm.engine.memory_report()["quantization"] == "none"
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    # Unset, --quantization keeps the checkpoint's 8 bits (per channel).
    with LLM(fp8, show_progress=False, kv_cache_memory=16 << 20, dtype="float32") as llm:
        assert llm.engine.memory_report()["quantization"] == "fp8"
        assert len(llm.generate(prompts[:1], params)[0].outputs[0].token_ids) == 8


def test_each_scale_shape_multiplies_its_weight():
    weight = torch.randn(5, 7).to(torch.float8_e4m3fn)
    values = weight.float()
    assert torch.equal(dequantize_fp8(weight, torch.tensor(0.5), None, torch.float32),
                       values * 0.5)
    rows = torch.rand(5)
    assert torch.equal(dequantize_fp8(weight, rows, None, torch.float32), values * rows[:, None])
    blocks = torch.rand(3, 2)  # blocks of 2 x 4: the last row and column blocks are partial
    tiled = blocks.repeat_interleave(2, 0)[:5].repeat_interleave(4, 1)[:, :7]
    assert torch.equal(dequantize_fp8(weight, blocks, (2, 4), torch.float32), values * tiled)
    with pytest.raises(ModelLoadError, match="does not fit a weight of shape"):
        dequantize_fp8(weight, blocks, (4, 4), torch.float32)


# bitsandbytes, and compressed-tensors' 4-bit floats (NVFP4).
OTHER_QUANTIZATIONS = {
    "bitsandbytes": {"load_in_4bit": True},
    "compressed-tensors": {"format": "nvfp4-pack-quantized", "config_groups": {
        "group_0": {"weights": {"type": "float", "num_bits": 4}}}}}


@pytest.mark.parametrize("method", sorted(OTHER_QUANTIZATIONS))
def test_other_quantized_checkpoints_are_refused_by_name(tmp_path, vocab_tokenizer, method):
    directory = _llama(str(tmp_path / "model"), vocab_tokenizer)
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    settings = {"quant_method": method, **OTHER_QUANTIZATIONS[method]}
    with open(path, "w") as f:
        json.dump({**config, "quantization_config": settings}, f)
    with pytest.raises(ModelLoadError, match=f"quantized with {method}.*--quantization int8"):
        LLM(directory, show_progress=False, **REFERENCE)
