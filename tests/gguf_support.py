"""GGUF files of families other than Llama, written here as llama.cpp's converter writes them:
the architecture's metadata, the built-in model's tokenizer (SmolLM2's BPE, copied from its
file) and every tensor under llama.cpp's name, in float32 or quantized to Q8_0 with gguf's own
quantizer. Beside it, the Hugging Face checkpoint of exactly the weights the file holds (Q8_0
values dequantized), which is what transformers' reference reads."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

# Hugging Face parameter names by llama.cpp's (per layer, then whole-model).
LAYER_TENSORS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
MODEL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
TOKENIZER_FIELDS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                    "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                    "tokenizer.ggml.add_bos_token", "tokenizer.chat_template")


def gguf_name(hf_name: str) -> str:
    if hf_name in MODEL_TENSORS:
        return MODEL_TENSORS[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, _, kind = rest.rpartition(".")
    return f"blk.{layer}.{LAYER_TENSORS[module]}.{kind}"


def write_gguf(path: str, arch: str, model: Any, tokenizer_gguf: str,
               q8: bool = False) -> dict[str, torch.Tensor]:
    """Write `model` (a transformers causal LM) as a GGUF file of architecture `arch`; return
    its weights as the file holds them (Q8_0 ones dequantized), by Hugging Face name. 1-D
    tensors (norms, biases) stay float32, as llama.cpp keeps them."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    source = gguf.GGUFReader(tokenizer_gguf)
    for name in TOKENIZER_FIELDS:
        field = source.fields[name]
        sub_type = field.types[-1] if len(field.types) > 1 else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    held = {}
    for name, tensor in model.state_dict().items():
        values = tensor.float().numpy()
        if q8 and values.ndim == 2:
            packed = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name(name), packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            values = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name(name), values)
        held[name] = torch.from_numpy(np.ascontiguousarray(values)).reshape(tensor.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def gguf_and_reference(directory: str, arch: str, config: Any, tokenizer: Any,
                       tokenizer_gguf: str, q8: bool = False) -> tuple[str, str]:
    """(a GGUF file of a random-weight model of `config`, the Hugging Face checkpoint of the
    same weights) under `directory`."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08 if p.dim() > 1 else 0.3)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{arch}.gguf")
    held = write_gguf(path, arch, model, tokenizer_gguf, q8)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(held[name])
    reference = os.path.join(directory, "reference")
    model.save_pretrained(reference)
    tokenizer.save_pretrained(reference)
    return path, reference
