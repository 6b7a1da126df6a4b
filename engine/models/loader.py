"""Build a model and fill it with weights from safetensors or GGUF (dequantized on load),
then optionally quantize its projections (int8 or fp8) or keep a GGUF file's quantization."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from tokenmill.engine.contract.model_shape import linear_attention_of
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.layers.int4_linear import Int4Weight
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.rotary import (
    LAYER_TYPES,
    check_rope,
    rope_parameters,
)
from tokenmill.engine.models.architecture import (
    AXK1,
    architecture_of,
    check_features,
    classifier_of,
    declare_attention_free,
    declare_family_names,
    encoder_of,
    flags_of,
    moe_shape_of,
)
from tokenmill.engine.models.classifier_head import token_head
from tokenmill.engine.models.config_overrides import ConfigOverrideError, apply_config_overrides
from tokenmill.engine.models.decoder import CausalLM, head_dim_of, num_kv_heads_of
from tokenmill.engine.models.encoder import EncoderModel
from tokenmill.engine.models.encoder_weights import build_encoder
from tokenmill.engine.models.fused_weights import (
    RowWindow,
    expert_parts,
    fused_parts,
    renamed,
    stored_transposed,
)
from tokenmill.engine.models.gguf_weights import (
    MOE_GGUF_REFUSAL,
    fast_gguf_parsing,
    gguf_int4_tensors,
    gguf_tensor_types,
    gguf_tensors,
)
from tokenmill.engine.models.multimodal import (
    is_language_model_of_multimodal,
    language_model_config,
    language_model_weight,
)
from tokenmill.engine.models.prequantized import checkpoint_quantization, dequantized_tensors
from tokenmill.engine.models.quantize import (
    auto_quantization,
    check_gguf_kept,
    check_quantization,
    keep_gguf_quantization,
    quantize_model,
)
from tokenmill.engine.models.rope_order import ROTATED, pairs_to_halves, rotary_halves
from tokenmill.engine.models.safetensors_files import Checkpoint, StoredTensor
from tokenmill.engine.models.source import ModelLoadError, ModelSource
from tokenmill.engine.models.torch_files import read_torch_weights, torch_files_bytes
from tokenmill.engine.models.weight_files import torch_weight_files, weight_files

# Buffers older checkpoints saved beside the weights: rotary frequencies, and GPT-NeoX's and
# GPT-2's causal mask and its fill value.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias",
                    ".attn.bias", ".attn.masked_bias")
# Tensors read at once: reads wait on the disk and copies (and first touches of the weights'
# memory) release the GIL, so a thread per core, up to 4, overlaps them (docs/benchmarks.md,
# "Model loading", compares counts).
LOAD_WORKERS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class LoadReport:
    """What loading the weights took on this rank: wall seconds from allocation until every
    weight is in place, and the checkpoint bytes it read (this rank's shard only)."""

    seconds: float
    bytes: int
    files: int
    workers: int

    @property
    def gb_per_s(self) -> float:
        return self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0

    def log_fields(self) -> dict[str, Any]:
        return {"load_seconds": round(self.seconds, 3), "load_bytes": self.bytes,
                "load_gb_per_s": round(self.gb_per_s, 3), "files": self.files,
                "workers": self.workers}


def load_config(source: ModelSource) -> Any:
    """The config of the model the engine runs: a multimodal checkpoint's language model's
    (models/multimodal.py), any other as the checkpoint gives it."""
    try:
        if source.config_directory:  # --hf-config-path
            config = language_model_config(_config(source.config_directory, None))
        elif source.gguf_file:
            config = copy.deepcopy(_gguf_config(source.directory, source.gguf_file,
                                                *_file_stamp(source.gguf_path)))
        else:
            config = language_model_config(_config(source.directory, None))
    except ModelLoadError:
        raise
    except Exception as exc:  # whatever transformers raises for the file
        raise ModelLoadError.reading(f"the model config from {_where(source)}", exc) from exc
    if source.config_overrides:
        try:
            config = apply_config_overrides(config, json.loads(source.config_overrides))
        except ConfigOverrideError as exc:
            raise ModelLoadError(f"--hf-overrides: {exc}") from exc
    declare_attention_free(config)
    declare_family_names(config)
    if getattr(config, "per_layer_config", None):
        # Layers of their own shapes (Gemma 4): read per layer where they differ
        # (layer_attention_shapes); the config's own values are the other layers'.
        config.allow_global_per_layer_attribute_access = True
        _quiet_global_reads()
    attends = getattr(config, "num_attention_heads", None) != 0  # 0: attention-free
    for kind in LAYER_TYPES if attends else ():  # refused now, in one line, not half-way in
        try:
            check_rope(rope_parameters(config, kind), head_dim_of(config, kind))
        except ValueError as exc:
            raise ModelLoadError(f"{_where(source)}: {exc}") from exc
    check_features(config)
    return config


class _GlobalReadsAllowed(logging.Filter):
    """Drops transformers' warning on reading a per-layer attribute globally: the engine reads
    those per layer where layers differ, so the warning would only alarm the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Reading global config value")


def _quiet_global_reads() -> None:
    logger = logging.getLogger("transformers.integrations.heterogeneity.configuration_utils")
    if not any(isinstance(f, _GlobalReadsAllowed) for f in logger.filters):
        logger.addFilter(_GlobalReadsAllowed())


# Where a multimodal checkpoint's processor keeps its chat template (transformers' legacy file).
PROCESSOR_CHAT_TEMPLATE = "chat_template.json"


def load_tokenizer(source: ModelSource) -> Any:
    try:
        if source.gguf_file:
            return copy.deepcopy(_gguf_tokenizer(source.directory, source.gguf_file,
                                                 *_file_stamp(source.gguf_path)))
        tokenizer = _tokenizer(source.directory, None)
    except Exception as exc:
        error = ModelLoadError.reading(f"the tokenizer from {_where(source)}", exc)
        raise ModelLoadError(f"{error} (to serve token ids without a tokenizer: "
                             "--skip-tokenizer-init)") from exc
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = _processor_chat_template(source.directory)
    return tokenizer


def _processor_chat_template(directory: str) -> str | None:
    """The chat template a multimodal checkpoint keeps for its processor in
    chat_template.json (LLaVA's, Mistral 3's), which AutoTokenizer does not read; None where
    there is none."""
    path = os.path.join(directory, PROCESSOR_CHAT_TEMPLATE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            template = json.load(f)["chat_template"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError.reading(path, exc) from exc
    if not isinstance(template, str):
        raise ModelLoadError(f"{path}: chat_template is not a string")
    return template


def check_tokenizer_fits(tokenizer: Any, model_config: Any, where: str) -> None:
    """ModelLoadError for a tokenizer from elsewhere (--tokenizer) with ids beyond the model's
    embeddings."""
    size, vocab = len(tokenizer), model_config.vocab_size
    if size > vocab:
        raise ModelLoadError(f"the tokenizer {where!r} has {size} tokens, more than the "
                             f"model's vocabulary ({vocab}): they are not the model's tokens")


def _config(directory: str, gguf_file: str | None) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory, gguf_file=gguf_file)


def _tokenizer(directory: str, gguf_file: str | None) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)


# transformers rebuilds a GGUF file's config and tokenizer by parsing all its metadata (the
# whole vocabulary, seconds each time); an engine started again in the same process on the
# same unchanged file gets copies of the first parse.
@functools.lru_cache(maxsize=2)
def _gguf_config(directory: str, gguf_file: str, mtime_ns: int, size: int) -> Any:
    with fast_gguf_parsing():
        return _config(directory, gguf_file)


@functools.lru_cache(maxsize=2)
def _gguf_tokenizer(directory: str, gguf_file: str, mtime_ns: int, size: int) -> Any:
    with fast_gguf_parsing():
        return _tokenizer(directory, gguf_file)


def _file_stamp(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_mtime_ns, stat.st_size


def _where(source: ModelSource) -> str:
    return source.gguf_path or source.directory


def build_model(config: Any, source: ModelSource, max_positions: int, dtype: torch.dtype,
                device: torch.device, show_progress: bool = True,
                quantization: str | None = None, tp: TPGroup | None = None,
                workers: int = LOAD_WORKERS, pooling: bool = False,
                head_token_ids: tuple[int, ...] = ()) -> CausalLM | EncoderModel | Any:
    """Allocate the model directly on `device` (no random init), load its weights, then
    quantize them if asked (after loading: checkpoints hold full-precision weights).
    `quantization` None means the checkpoint's own where this device runs it (a GGUF file's
    4- and 8-bit blocks on the CPU; fp8 for an FP8 checkpoint), else none; the model's
    `quantization` says which ran.

    Under tensor parallelism only this rank's shard is allocated and read from the checkpoint
    (safetensors reads just those bytes; GGUF tensors are dequantized one at a time).
    `workers` safetensors tensors are read at once. The returned model's `load_report` says
    what the load took.

    `pooling` (the embedding runner) never projects to the vocabulary: the LM head is the
    embeddings' weight, and a checkpoint's own head, if it has one, is not read; but a
    classifier made of its head's rows (`head_token_ids`: the tokens of vLLM's
    classifier_from_token) reads it, takes those rows, then lets it go.

    An encoder (BERT's family) is built whole and unquantized (the engine refuses the options
    it does not take)."""
    if encoder_of(config) is not None:
        model, seconds, nbytes, files = build_encoder(config, source, max_positions, dtype,
                                                      device, show_progress)
        model.load_report = LoadReport(seconds, nbytes, files, 1)
        model.quantization = None
        return model
    check_quantization(quantization)
    if source.gguf_file and moe_shape_of(config) is not None:
        raise ModelLoadError(f"{source.gguf_file} holds {MOE_GGUF_REFUSAL}")
    family = _safetensors_only_family(config)
    if source.gguf_file and family:
        raise ModelLoadError(f"{source.gguf_file} holds a {family} model, which tokenmill "
                             "serves from its safetensors checkpoint (the Hugging Face "
                             "repository), not from GGUF")
    tp = tp or TPGroup()
    keeps = source.gguf_file and quantization in (None, "gguf")
    gguf_types = gguf_tensor_types(source.gguf_path) if keeps else {}
    published = None if source.gguf_file else checkpoint_quantization(config)
    if quantization is None:
        # An FP8 (or 8-bit integer) checkpoint stays 8-bit (per channel once dequantized), as
        # a GGUF file's kept types stay as stored.
        quantization = published[0] if published and published[0] in ("fp8", "int8") else \
            auto_quantization(gguf_types, device, tp.size)
    if quantization == "gguf":
        check_gguf_kept(device, tp.size, source.gguf_file)
    start = time.perf_counter()
    plan = ShardPlan.for_model(config, tp.rank, tp.size)
    with torch.device("meta"):
        model = CausalLM(config, max_positions, plan, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    for module in model.modules():  # weights a checkpoint keeps in float32 (GLM's router)
        if getattr(module, "keeps_float32", False):
            module.float()
    for module in model.modules():  # computed from the config, not loaded (ALiBi's slopes)
        fill = getattr(module, "fill_computed_buffers", None)
        if fill is not None:
            fill()
    # Rotary tables are computed, not loaded: rebuild them on the device in float32.
    full, local = model.model.rotary_tables()
    model.model.rotary, model.model.rotary_local = full and full.to(device), \
        local and local.to(device)
    pickled = None if source.gguf_file else _pickled_weights(source.directory, published)
    checkpoint = None if source.gguf_file or pickled else Checkpoint(source.directory)
    with checkpoint or contextlib.nullcontext():
        stored = list(pickled[1]) if pickled else \
            None if checkpoint is None else [t.name for t in checkpoint.tensors]
        if (pooling and not head_token_ids) or _ties_head(config, stored):
            model.lm_head.weight = model.model.embed_tokens.weight
        built = {"score.weight"} if head_token_ids else set()
        if pickled:
            _read_checkpoint(model, pickled, None, published, show_progress, built=built)
            files, nbytes, workers = len(pickled[0]), torch_files_bytes(pickled[0]), 1
        elif checkpoint is None:
            _load(model, _gguf_named(source, config), plan, show_progress, built=built)
            files, nbytes, workers = 1, os.path.getsize(source.gguf_path), 1
        else:
            _read_checkpoint(model, None, checkpoint, published, show_progress, workers, built)
            files, nbytes = len(checkpoint.files), checkpoint.bytes_read
    if head_token_ids:
        with torch.no_grad():
            model.score.weight.copy_(token_head(model, head_token_ids,
                                                classifier_of(config).two_way, plan, tp))
        model.lm_head.weight = model.model.embed_tokens.weight  # the read head let go
    model.load_report = LoadReport(time.perf_counter() - start, nbytes, files, workers)
    model.quantization = quantization if quantization != "none" else None
    if quantization == "gguf":
        keep_gguf_quantization(model, gguf_types, dict(_gguf_int4_named(source, config)))
    elif model.quantization is not None:
        quantize_model(model, quantization)
        if device.type == "cuda":
            # Hand the released full-precision weights back to the driver: the KV-cache budget
            # is read from the free device memory.
            torch.cuda.empty_cache()
    return model.eval()


# What a reloaded checkpoint must agree on with the running model: the shapes it was built to.
RELOAD_SHAPE_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                       "tie_word_embeddings")


def reload_refusal(model: Any) -> str | None:
    """Why the weights of this built model cannot be read again in place (None: they can)."""
    if not isinstance(model, CausalLM) or model.score is not None:
        return "only a generating model's weights are reloaded"
    if getattr(model, "quantization", None):
        return (f"its weights are quantized ({model.quantization}) after loading; only "
                "unquantized weights are reloaded in place")
    return None


def check_reload(config: Any, source: ModelSource) -> None:
    """ModelLoadError unless `source` is a checkpoint (safetensors or pickled) of the shapes
    of the running model's `config`."""
    if source.gguf_file:
        raise ModelLoadError(f"{source.gguf_file}: weights are reloaded from safetensors or "
                             "pickled checkpoints, not GGUF")
    other = load_config(source)
    differ = [f"{field} {getattr(config, field, None)} -> {getattr(other, field, None)}"
              for field in RELOAD_SHAPE_FIELDS
              if getattr(config, field, None) != getattr(other, field, None)]
    if differ:
        raise ModelLoadError(f"{_where(source)} is not a checkpoint of the running model's "
                             f"shapes: {', '.join(differ)}")


def reload_weights(model: CausalLM, source: ModelSource, show_progress: bool = False) -> None:
    """Read the checkpoint at `source` into the model's parameters, in place: their storages
    and addresses stay, so captured decode graphs still hold (a trainer's new weights, or what
    a level-2 sleep dropped). check_reload first; a checkpoint that turns out to lack a tensor
    raises ModelLoadError with the others already read."""
    published = checkpoint_quantization(load_config(source))
    pickled = _pickled_weights(source.directory, published)
    checkpoint = None if pickled else Checkpoint(source.directory)
    with checkpoint or contextlib.nullcontext():
        _read_checkpoint(model, pickled, checkpoint, published, show_progress, LOAD_WORKERS)


def load_named_weights(model: CausalLM, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Copy tensors under their Hugging Face names (a trainer's state dict, whole or in
    part) into the model's parameters, in place, each sharded as the checkpoint's would be;
    returns how many parameters were filled. ModelLoadError for a name the model has no
    place for, or a shape that does not fit (the tensors before it already copied)."""
    filled = _load(model, ((name, tensor, len(weights)) for name, tensor in weights),
                   model.plan, show_progress=False, partial=True)
    return len(filled)


def _read_checkpoint(model: CausalLM, pickled: tuple[list[str], dict[str, Any]] | None,
                     checkpoint: Checkpoint | None, published: tuple[str, Any] | None,
                     show_progress: bool, workers: int = 1,
                     built: set[str] | None = None) -> None:
    """Every tensor of a checkpoint into the model: PyTorch's pickled files (`pickled`, as
    _pickled_weights read them) or safetensors (`checkpoint`, open, `workers` read at once)."""
    if pickled:
        tensors = pickled[1]
        _load(model, ((name, t, len(tensors)) for name, t in tensors.items()), model.plan,
              show_progress, built=built)
    else:
        _load(model, _checkpoint_tensors(checkpoint, published,
                                         model.model.embed_tokens.weight.dtype),
              model.plan, show_progress, checkpoint, workers, built=built)


def _checkpoint_tensors(checkpoint: Checkpoint, published: tuple[str, Any] | None,
                        dtype: torch.dtype) -> Iterator[tuple[str, Any, int]]:
    """(name, stored tensor, how many) of the checkpoint's tensors; a pre-quantized
    checkpoint's (`published`: checkpoint_quantization's answer) weights dequantized into
    `dtype` (models/prequantized.py)."""
    named = [(t.name, t) for t in checkpoint.tensors]
    if published is None:
        return ((name, t, len(named)) for name, t in named)
    kind, detail = published
    return dequantized_tensors(named, kind, detail, lambda t: checkpoint.slice(t)[:], dtype)


# The families of LayerNorm models, by architecture, as a refusal names them.
LAYER_NORM_FAMILIES = {"PhiForCausalLM": "Phi-2", "StableLmForCausalLM": "StableLM",
                       "NemotronForCausalLM": "Nemotron", "GPTNeoXForCausalLM": "GPT-NeoX",
                       "GPT2LMHeadModel": "GPT-2", "GPTBigCodeForCausalLM": "GPT-BigCode",
                       "OPTForCausalLM": "OPT", "GPTJForCausalLM": "GPT-J",
                       "FalconForCausalLM": "Falcon", "BloomForCausalLM": "BLOOM",
                       "MptForCausalLM": "MPT"}


def _pickled_weights(directory: str, published: tuple[str, Any] | None,
                     ) -> tuple[list[str], dict[str, torch.Tensor]] | None:
    """(files, tensors by name) of a model published as PyTorch's pickled files only (no
    safetensors weights), else None."""
    if weight_files(directory):
        return None
    paths = torch_weight_files(directory)
    if not paths:
        return None
    if published is not None:
        raise ModelLoadError(f"{directory} holds {published[0]} weights in PyTorch's pickled "
                             "files; pre-quantized checkpoints are read from safetensors")
    return paths, read_torch_weights(paths)


def _safetensors_only_family(config: Any) -> str | None:
    """The family of a model whose GGUF files the engine does not read (their norms, fused
    tensors or multipliers are stored in ways the GGUF reader does not map), or None."""
    flags = flags_of(config)
    if flags.gemma:
        return "Gemma"
    if linear_attention_of(config) is not None:
        return "Qwen3.5 or Qwen3-Next"
    if flags.granite:
        return "Granite"
    if architecture_of(config) == "Exaone4ForCausalLM":
        return "EXAONE 4"
    if flags.cohere:
        return "Cohere"
    if flags.layer_norm:
        return LAYER_NORM_FAMILIES.get(architecture_of(config), "StarCoder 2")
    if flags.interleaved_rope:
        return "GLM-4" if flags.bias_on_qkv_only else "ERNIE 4.5"
    if flags.projection_qk_norm:
        return "OLMo"
    return "Phi-3" if architecture_of(config) == "Phi3ForCausalLM" else None


def _ties_head(config: Any, stored: list[str] | None) -> bool:
    """Whether the LM head is the embeddings' weight, as the config says; but a multimodal
    checkpoint carrying a head of its own keeps it (transformers 5 reads the tie from the
    outer config, whose default ties Mistral 3's, and unties a head the checkpoint holds).
    `stored`: the safetensors checkpoint's tensor names (None: a GGUF file)."""
    if not getattr(config, "tie_word_embeddings", False):
        return False
    if stored is None or not is_language_model_of_multimodal(config):
        return True
    return "lm_head.weight" not in (language_model_weight(name) for name in stored)


def _load(model: CausalLM, tensors: Iterable[tuple[str, Any, int]], plan: ShardPlan,
          show_progress: bool, checkpoint: Checkpoint | None = None, workers: int = 1,
          built: set[str] | None = None, partial: bool = False) -> set[str]:
    """Put every checkpoint tensor in its place. A `StoredTensor` of `checkpoint` is read
    straight into its parameter where it can (`workers` at once); other tensors (GGUF's,
    dequantized) arrive as torch tensors, one at a time. `built`: parameters made after
    loading, from others, which the checkpoint need not hold; `partial`: some of the
    parameters, the others kept. Returns the parameters filled."""
    params = checkpoint_tensors(model)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    multimodal = is_language_model_of_multimodal(model.config)
    interleaved = flags_of(model.config).interleaved_rope
    loaded: set[str] = set()

    def place(name: str, stored: Any) -> list[str]:
        """The names of the parameters checkpoint tensor `name` filled (none: not read)."""
        if multimodal:  # the language model's tensors under its causal names; no other tower
            name = language_model_weight(name)
            if name is None:
                return []
        if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight") or \
                prediction_layer(model.config, name) or unread_tensor(model.config, name):
            return []
        if name not in params and f"model.{name}" in params:  # a bare decoder's names
            name = f"model.{name}"
        name = renamed(model.config, name)
        if interleaved and name.endswith(ROTATED):  # pairs (2i, 2i+1) to halves, per head
            stored = rotary_halves(model.config, name.split(".")[-2],
                                   stored_for(stored, None)[:])
        if stored_transposed(model.config, name):
            stored = stored_for(stored, None)[:].t().contiguous()
        experts = None if name in params else expert_parts(model.config, name)
        if experts:  # one tensor holding a layer's experts: read once, placed part by part
            whole = stored_for(stored, None)[:]
            return [put(part, turned(part, take(whole))) for part, take in experts]
        parts = None if name in params else fused_parts(model.config, name)
        if parts and all(part in params for part, _, _ in parts):
            if tuple(stored.shape)[0] != parts[-1][2]:
                raise ModelLoadError(f"{name}: checkpoint shape {tuple(stored.shape)} does not "
                                     f"hold its {len(parts)} parts' {parts[-1][2]} rows")
            return [put(part, RowWindow(stored_for(stored, params[part]), start, stop))
                    for part, start, stop in parts]
        if name not in params:
            if name.endswith(".bias") and not stored_for(stored, None)[:].any():
                return []  # a zero bias of a projection without one (AutoGPTQ writes them)
            raise ModelLoadError(f"checkpoint tensor {name!r} has no place in the model")
        return [put(name, stored_for(stored, params[name]))]

    def turned(name: str, rows: torch.Tensor) -> torch.Tensor:
        """A part split out of a fused tensor, reordered as a stored q_proj or k_proj is
        (CodeGen's, rotating adjacent pairs)."""
        if interleaved and name.endswith(ROTATED):
            return rotary_halves(model.config, name.split(".")[-2], rows)
        return rows

    def stored_for(stored: Any, target: torch.Tensor) -> Any:
        """A checkpoint tensor as ShardPlan.shard reads it: bytes read straight into `target`
        where they can land there."""
        if isinstance(stored, StoredTensor) and checkpoint is not None:
            return checkpoint.slice(stored, into=target)
        return stored

    def put(name: str, stored: Any) -> str:
        target = params[name]
        tensor = plan.shard(name, stored)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape "
                             f"{tuple(target.shape)}" + (f" (rank {plan.rank} of {plan.size})"
                                                         if plan.size > 1 else ""))
        if tensor is not target:
            # From pinned staging memory the copy to a GPU is asynchronous.
            asynchronous = target.device.type == "cuda" and tensor.is_pinned()
            with torch.no_grad():
                target.copy_(tensor, non_blocking=asynchronous)
        return name

    progress: tqdm | None = None

    def jobs() -> Iterator[tuple[str, Any]]:
        nonlocal progress
        for name, stored, total in tensors:
            if progress is None:
                progress = tqdm(total=total, desc="Loading weights", unit="tensor",
                                disable=not show_progress)
            yield name, stored

    def placed(filled: Iterable[list[str]]) -> None:
        for names in filled:
            progress.update(1)
            loaded.update(names)

    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="load") as pool:
            placed(pool.map(lambda job: place(*job), jobs()))
    else:
        placed(place(*job) for job in jobs())
    if progress is not None:
        progress.close()
    if tied:
        loaded.add("lm_head.weight")
    device = model.lm_head.weight.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the last copies to the device are asynchronous
    missing = sorted(set(params) - loaded - (built or set()))
    for name in [name for name in missing if absent_as_zero(model.config, name)]:
        with torch.no_grad():
            params[name].zero_()
        missing.remove(name)
    if missing and not partial:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    return loaded


def unread_tensor(config: Any, name: str) -> bool:
    """Whether `name` is a tensor the model has no use for: A.X K1's checkpoints carry their
    sparse blocks' output norm (post_mlp_layernorm) for the dense layers too."""
    if getattr(config, "model_type", None) != AXK1 or ".post_mlp_layernorm." not in name:
        return False
    layer = name.partition(".layers.")[2].partition(".")[0]
    return layer.isdigit() and int(layer) in moe_shape_of(config).dense_layers


def absent_as_zero(config: Any, name: str) -> bool:
    """Whether parameter `name`, when a checkpoint lacks it, stands for zeros: A.X K1's routing
    correction bias, which its published checkpoints leave out (transformers starts it at
    zero)."""
    return getattr(config, "model_type", None) == AXK1 and \
        name.endswith("e_score_correction_bias")


def prediction_layer(config: Any, name: str) -> bool:
    """Whether `name` belongs to a multi-token-prediction layer stored after the decoder's
    (DeepSeek-V3's and GLM-4.5's num_nextn_predict_layers, MiniMax-M2's num_mtp_modules,
    Hunyuan 3's one,
    numbered from num_hidden_layers; Qwen3.5's, Qwen3-Next's and K-EXAONE's under mtp.,
    MiMo-V2-Flash's under model.mtp.): a draft head the engine does not run, so it is not
    read."""
    if name.startswith(("mtp.", "model.mtp.")):
        return True
    predicts = getattr(config, "num_nextn_predict_layers", 0) or \
        getattr(config, "num_mtp_modules", 0) or \
        int(getattr(config, "model_type", None) == "hy_v3")  # Hunyuan 3's, whatever its config
    if not predicts or not name.startswith("model.layers."):
        return False
    index = name.split(".")[2]
    return index.isdigit() and int(index) >= config.num_hidden_layers


def _gguf_named(source: ModelSource, config: Any) -> Iterator[tuple[str, torch.Tensor, int]]:
    unpermute = getattr(config, "model_type", "") == "llama"
    heads = {"q_proj": config.num_attention_heads, "k_proj": num_kv_heads_of(config)}
    for name, tensor, total in gguf_tensors(source.gguf_path):
        kind = name.split(".")[-2]
        if unpermute and kind in heads:
            tensor = pairs_to_halves(tensor, heads[kind])
        yield name, tensor, total


def _gguf_int4_named(source: ModelSource, config: Any) -> Iterator[tuple[str, Int4Weight]]:
    """The file's 4-bit tensors as stored, rows in the Hugging Face order (as _gguf_named)."""
    unpermute = getattr(config, "model_type", "") == "llama"
    heads = {"q_proj": config.num_attention_heads, "k_proj": num_kv_heads_of(config)}
    for name, codes in gguf_int4_tensors(source.gguf_path):
        kind = name.split(".")[-2]
        if unpermute and kind in heads:
            codes = Int4Weight(*(pairs_to_halves(t, heads[kind])
                                 for t in (codes.codes, codes.scale, codes.zero)))
        yield name, codes


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
