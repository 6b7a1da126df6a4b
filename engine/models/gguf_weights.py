"""Read GGUF tensors, dequantized to float32, under Hugging Face parameter names."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from tokenmill.engine.models.source import ModelLoadError

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ModelLoadError(f"GGUF tensor {gguf_name!r} is not part of a supported architecture")


def gguf_tensors(path: str) -> Iterator[tuple[str, torch.Tensor, int]]:
    """(HF name, float32 tensor, number of tensors) for every tensor in the file."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # a truncated or corrupt file
        raise ModelLoadError.reading(f"the weights in {path}", exc) from exc
    total = len(reader.tensors)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        array = np.array(data, dtype=np.float32, copy=True).reshape(shape)
        yield hf_name(t.name), torch.from_numpy(array), total
