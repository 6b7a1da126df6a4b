"""What the LoRA tests share: random PEFT adapters saved by `peft` itself, and Hugging Face +
peft's greedy continuation and log-probabilities under one adapter as the reference."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from model_support import hf_greedy, update_json_file

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Adapter:
    name: str
    rank: int
    alpha: int
    targets: list[str] | str
    rslora: bool = False
    seed: int = 1


# Two ranks, rsLoRA on one, one adapter touching only some modules.
ADAPTERS = [Adapter("sql", 4, 8, ALL_TARGETS, seed=1),
            Adapter("chat", 8, 16, ALL_TARGETS, rslora=True, seed=2),
            Adapter("part", 4, 4, ["q_proj", "v_proj", "down_proj"], seed=3)]


def make_adapter(base_dir: str, directory: str, adapter: Adapter) -> str:
    """A PEFT adapter of the model in base_dir with random A and B (PEFT starts B at zero,
    which would make the adapter a no-op), saved with save_pretrained."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=adapter.rank, lora_alpha=adapter.alpha,
                        target_modules=adapter.targets, use_rslora=adapter.rslora)
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(adapter.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.15)
    model.save_pretrained(directory)
    return directory


def peft_model(base_dir: str, adapter_dir: str | None):
    """The HF model of base_dir with the adapter applied (None: the base alone)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    return model if adapter_dir is None else PeftModel.from_pretrained(model, adapter_dir).eval()


def peft_greedy(base_dir: str, adapter_dir: str | None, prompts: list[list[int]],
                max_new: int) -> list[list[int]]:
    model = peft_model(base_dir, adapter_dir)
    return [hf_greedy(model, p, max_new) for p in prompts]


def peft_logprobs(base_dir: str, adapter_dir: str, ids: list[int]) -> torch.Tensor:
    """[len - 1, vocab] next-token log-probabilities of one forward pass over `ids`."""
    model = peft_model(base_dir, adapter_dir)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def edit_config(directory: str, **changes) -> None:
    """Change fields of an adapter's adapter_config.json in place."""
    update_json_file(os.path.join(directory, "adapter_config.json"), **changes)


def check_adapter_equals_peft(directory: str, adapter_dir: str, targets: list[str]) -> None:
    """A random rank-4 adapter on `targets`, served by the engine: its greedy output equals
    peft's and differs from the base model's."""
    from tokenmill.engine import LLM, SamplingParams

    served = make_adapter(directory, adapter_dir, Adapter("mixed", 4, 8, targets))
    prompt, new = [5, 6, 7, 8, 9], 8
    with LLM(directory, lora_modules=(f"mixed={served}",), enable_lora=True, max_lora_rank=8,
             show_progress=False, dtype="float32") as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=new,
                                                    ignore_eos=True), lora="mixed")
    adapted = peft_greedy(directory, served, [prompt], new)
    assert [out[0].outputs[0].token_ids] == adapted != peft_greedy(directory, None, [prompt],
                                                                   new)
