"""Build a model and fill it with weights from safetensors or GGUF (dequantized on load),
then optionally quantize its projections (int8 or fp8)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.rotary import RotaryEmbedding, rope_parameters
from tokenmill.engine.models.decoder import CausalLM, head_dim_of, num_kv_heads_of
from tokenmill.engine.models.gguf_weights import gguf_tensors
from tokenmill.engine.models.quantize import check_quantization, quantize_model
from tokenmill.engine.models.source import ModelLoadError, ModelSource

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_config(source: ModelSource) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source.directory, gguf_file=source.gguf_file)
    except Exception as exc:  # whatever transformers raises for the file
        raise ModelLoadError.reading(f"the model config from {_where(source)}", exc) from exc


def load_tokenizer(source: ModelSource) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.directory, gguf_file=source.gguf_file)
    except Exception as exc:
        raise ModelLoadError.reading(f"the tokenizer from {_where(source)}", exc) from exc


def _where(source: ModelSource) -> str:
    return source.gguf_path or source.directory


def build_model(config: Any, source: ModelSource, max_positions: int, dtype: torch.dtype,
                device: torch.device, show_progress: bool = True,
                quantization: str | None = None, tp: TPGroup | None = None) -> CausalLM:
    """Allocate the model directly on `device` (no random init), load its weights, then
    quantize them if asked (after loading: checkpoints hold full-precision weights).

    Under tensor parallelism only this rank's shard is allocated and read from the checkpoint
    (safetensors slices read just those bytes; GGUF tensors are dequantized one at a time)."""
    check_quantization(quantization)
    tp = tp or TPGroup()
    plan = ShardPlan.for_model(config, tp.rank, tp.size)
    with torch.device("meta"):
        model = CausalLM(config, max_positions, plan, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    # Rotary tables are computed, not loaded: rebuild them on the device in float32.
    model.model.rotary = RotaryEmbedding(
        head_dim_of(config), max_positions, rope_parameters(config)
    ).to(device)
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    tensors = _gguf_named(source, config) if source.gguf_file else _safetensors(source)
    _load(model, tensors, plan, show_progress)
    if quantization is not None:
        quantize_model(model, quantization)
        if device.type == "cuda":
            # Hand the released full-precision weights back to the driver: the KV-cache budget
            # is read from the free device memory.
            torch.cuda.empty_cache()
    return model.eval()


def _load(model: CausalLM, tensors: Iterator[tuple[str, Any, int]], plan: ShardPlan,
          show_progress: bool) -> None:
    params = checkpoint_tensors(model)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    loaded: set[str] = set()
    progress = None
    for name, stored, total in tensors:
        if progress is None:
            progress = tqdm(total=total, desc="Loading weights", unit="tensor",
                            disable=not show_progress)
        progress.update(1)
        if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        if name not in params:
            raise ModelLoadError(f"checkpoint tensor {name!r} has no place in the model")
        target = params[name]
        tensor = plan.shard(name, stored)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape "
                             f"{tuple(target.shape)}" + (f" (rank {plan.rank} of {plan.size})"
                                                         if plan.size > 1 else ""))
        with torch.no_grad():
            target.copy_(tensor)
        loaded.add(name)
    if progress is not None:
        progress.close()
    if tied:
        loaded.add("lm_head.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")


def _safetensors(source: ModelSource) -> Iterator[tuple[str, Any, int]]:
    """Each tensor as a lazy slice: the loader reads only the part its rank holds."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(source.directory, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {source.directory}")
    handles = []
    for f in files:
        try:
            handles.append(safe_open(f, framework="pt", device="cpu"))
        except Exception as exc:  # a truncated or corrupt file
            raise ModelLoadError.reading(f"the weights in {f}", exc) from exc
    names = [list(h.keys()) for h in handles]
    total = sum(len(n) for n in names)
    for handle, handle_names in zip(handles, names, strict=True):
        for name in handle_names:
            yield name, handle.get_slice(name), total


def _gguf_named(source: ModelSource, config: Any) -> Iterator[tuple[str, torch.Tensor, int]]:
    unpermute = getattr(config, "model_type", "") == "llama"
    heads = {"q_proj": config.num_attention_heads, "k_proj": num_kv_heads_of(config)}
    for name, tensor, total in gguf_tensors(source.gguf_path):
        kind = name.split(".")[-2]
        if unpermute and kind in heads:
            tensor = _undo_rope_permute(tensor, heads[kind])
        yield name, tensor, total


def _undo_rope_permute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp interleaves each head's rotary halves in Q/K rows; restore the HF layout."""
    rows = w.shape[0]
    return (w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
            .transpose(1, 2).reshape(w.shape))


def checkpoint_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors by their Hugging Face names: a merged projection's parameters are
    replaced by views of its parts (q_proj/k_proj/v_proj, gate_proj/up_proj)."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    for path, module in model.named_modules():
        if isinstance(module, MergedLinear):
            tensors.pop(f"{path}.weight")
            tensors.pop(f"{path}.bias", None)
            parent = path.rpartition(".")[0]
            tensors.update({f"{parent}.{name}": view
                            for name, view in module.part_tensors().items()})
    return tensors
