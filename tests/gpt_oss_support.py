"""GPT-OSS checkpoints of random weights, as transformers saves them (experts unquantized) and
as OpenAI publishes them (experts in MXFP4: `_blocks` and `_scales`)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch
from model_support import save_tokenizer
from safetensors.torch import load_file, save_file


def gpt_oss_config(vocab: int, **changes: Any) -> Any:
    """Four layers, sliding (8 positions) and full alternating, four experts of which two run,
    YaRN over a 128-token original context without truncation, as GPT-OSS's."""
    from transformers import GptOssConfig

    sizes = dict(vocab_size=vocab, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                 max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                  "original_max_position_embeddings": 128})
    return GptOssConfig(**{**sizes, **changes})


def make_gpt_oss(directory: str, tokenizer: Any, **changes: Any) -> str:
    """A random GPT-OSS whose biases and sinks are drawn too (transformers starts the experts'
    biases at zero, which would hide where they land)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(gpt_oss_config(len(tokenizer), **changes),
                                             dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.08)
            elif "norm" not in name:
                param.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    return directory


def mxfp4_copy(directory: str, out: str) -> str:
    """`directory`'s GPT-OSS with its experts' weights replaced by random MXFP4 codes: the
    engine reads `out` (blocks and scales), transformers reads `directory` rewritten with the
    same weights dequantized by transformers' own MXFP4 code. Returns `out`."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(1)
    packed = {}
    for name in list(tensors):
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        experts, columns, rows = tensors[name].shape  # stored [experts, in, out]
        blocks = torch.randint(0, 256, (experts, rows, columns // 32, 16), generator=gen,
                               dtype=torch.uint8)
        scales = torch.randint(120, 126, (experts, rows, columns // 32), generator=gen,
                               dtype=torch.uint8)
        tensors[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
    save_file(tensors, path, metadata={"format": "pt"})
    shutil.copytree(directory, out, ignore=shutil.ignore_patterns("model.safetensors"))
    quantized = {n: t for n, t in tensors.items()
                 if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    save_file({**quantized, **packed}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    # As OpenAI's config.json says it.
    config_path = os.path.join(out, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    with open(config_path, "w") as f:
        json.dump(config, f)
    return out
