"""Build an encoder (models/encoder.py) on its device and read its safetensors checkpoint.

An encoder checkpoint names its tensors as transformers' BertModel does, under `bert.` or
`roberta.` where a head follows (or where a library saved the whole model); the head's own
names differ by family (BERT: `bert.pooler.dense`, `classifier`; RoBERTa: `classifier.dense`,
`classifier.out_proj`) and land in `score`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm import tqdm

from tokenmill.engine.models.architecture import ENCODERS, encoder_of
from tokenmill.engine.models.encoder import EncoderModel
from tokenmill.engine.models.modernbert import ModernBertEncoder
from tokenmill.engine.models.safetensors_files import Checkpoint
from tokenmill.engine.models.source import ModelLoadError, ModelSource

PREFIXES = ("bert.", "roberta.", "distilbert.", "model.")
# Checkpoint names of a classifier's head, in score's terms.
HEAD_NAMES = {"pooler.dense.": "score.dense.", "classifier.dense.": "score.dense.",
              "classifier.out_proj.": "score.out.", "pre_classifier.": "score.dense.",
              "classifier.": "score.out.", "head.": "score."}
# DistilBERT's layers under BERT's names, by the part after transformer.layer.N.
DISTILBERT_PARTS = {"attention.q_lin": "attention.self.query",
                    "attention.k_lin": "attention.self.key",
                    "attention.v_lin": "attention.self.value",
                    "attention.out_lin": "attention.output.dense",
                    "sa_layer_norm": "attention.output.LayerNorm",
                    "ffn.lin1": "intermediate.dense", "ffn.lin2": "output.dense",
                    "output_layer_norm": "output.LayerNorm"}
# What an encoder checkpoint may hold that no step computes: position ids (a buffer older
# checkpoints saved), a masked-LM head, and the pooler of a model served for embeddings.
UNUSED = ("embeddings.position_ids", "cls.", "lm_head.", "vocab_transform.",
          "vocab_layer_norm.", "vocab_projector.")


def parameter_name(name: str, classifier: bool) -> str | None:
    """The model parameter a checkpoint tensor fills, None for one no step reads. Very old
    checkpoints call LayerNorm's weight and bias gamma and beta."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(UNUSED):
        return None
    if name.startswith("pooler.") and not classifier:
        return None
    for old, new in HEAD_NAMES.items():
        if name.startswith(old):
            name = new + name[len(old):]
            break
    if name.startswith("transformer.layer."):  # DistilBERT
        _, _, index, rest = name.split(".", 3)
        part, _, attr = rest.rpartition(".")
        name = f"encoder.layer.{index}.{DISTILBERT_PARTS.get(part, part)}.{attr}"
    if name.endswith(".gamma"):
        name = name[:-len("gamma")] + "weight"
    elif name.endswith(".beta"):
        name = name[:-len("beta")] + "bias"
    return name


def build_encoder(config: Any, source: ModelSource, max_positions: int, dtype: torch.dtype,
                  device: torch.device, show_progress: bool = True
                  ) -> tuple[EncoderModel | ModernBertEncoder, float, int, int]:
    """The encoder with its weights in place, and what loading took: (model, seconds, bytes
    read, files)."""
    if source.gguf_file:
        raise ModelLoadError(f"{source.gguf_file}: tokenmill serves BERT-family encoders from "
                             "their safetensors checkpoint, not from GGUF")
    start = time.perf_counter()
    family, classifier = ENCODERS[encoder_of(config)]
    with torch.device("meta"):
        model = ModernBertEncoder(config, classifier, max_positions) \
            if family == "modernbert" else EncoderModel(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    if family == "modernbert":  # rotary tables are computed, not loaded
        full, local = model.rotary_tables()
        model.rotary, model.rotary_local = full.to(device), local.to(device)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    with Checkpoint(source.directory) as checkpoint:
        for stored in tqdm(checkpoint.tensors, desc="Loading weights", unit="tensor",
                           disable=not show_progress):
            name = parameter_name(stored.name, classifier)
            if name is None:
                continue
            target = params.get(name)
            if target is None:
                raise ModelLoadError(f"checkpoint tensor {stored.name!r} has no place in the "
                                     "model")
            if tuple(stored.shape) != tuple(target.shape):
                raise ModelLoadError(f"{stored.name}: checkpoint shape {tuple(stored.shape)} "
                                     f"!= model shape {tuple(target.shape)}")
            tensor = checkpoint.slice(stored, into=target)[:]
            if tensor is not target:
                with torch.no_grad():
                    target.copy_(tensor)
            loaded.add(name)
        nbytes, files = checkpoint.bytes_read, len(checkpoint.files)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return model.eval(), time.perf_counter() - start, nbytes, files
