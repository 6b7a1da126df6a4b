"""The language model inside a multimodal checkpoint (Gemma 3 4B-27B, Mistral Small 3.1,
LLaVA, Qwen2.5-VL, Qwen3-VL), run as a causal model under its own names. The other towers'
tensors are not read here: LLaVA's image encoder is built apart (models/images.py); for the
others a request with an image part is refused."""

from __future__ import annotations

import copy
from typing import Any

from tokenmill.engine.models.architecture import MODEL_TYPES, MULTIMODAL_TEXT_MODELS
from tokenmill.engine.models.source import ModelLoadError

# Where checkpoints keep the language model: as first published (`language_model.model.*`,
# `language_model.lm_head.*`; Qwen2-VL's and Qwen2.5-VL's as a causal model's, beside
# `visual.*`) and as transformers has saved them since 4.52 (`model.language_model.*`,
# `lm_head.*`). Every other tensor belongs to another tower.
_LANGUAGE_MODEL_PREFIXES = (("language_model.model.", "model."),
                            ("language_model.lm_head.", "lm_head."),
                            ("model.language_model.", "model."),
                            ("model.text_model.", "model."),  # Idefics 3's, SmolVLM's
                            ("lm_head.", "lm_head."),
                            ("model.embed_tokens.", "model.embed_tokens."),
                            ("model.layers.", "model.layers."),
                            ("model.norm.", "model.norm."))


def multimodal_architecture(config: Any) -> str | None:
    """The config's multimodal architecture whose language model the engine serves, or None."""
    names = getattr(config, "architectures", None) or []
    return next((name for name in names if name in MULTIMODAL_TEXT_MODELS), None)


def language_model_config(config: Any) -> Any:
    """The config the engine runs: a multimodal checkpoint's text config, made a causal model's
    (its architecture from its model type; `multimodal` names where it came from, for the
    loader; `multimodal_config` is the whole checkpoint's, for its image encoder), any other
    config as it is."""
    outer = multimodal_architecture(config)
    if outer is None:
        return config
    text = copy.deepcopy(config.text_config)
    causal = MODEL_TYPES.get(text.model_type)
    if causal is None:
        raise ModelLoadError(f"the language model of this {outer} checkpoint is a "
                             f"{text.model_type!r} model, which tokenmill does not run")
    text.architectures = [causal]
    # transformers 5 ties the head by the outer config, 4.x by the text config: either may ask.
    # A checkpoint that carries its own head keeps it (the loader decides).
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False)
                                    or getattr(text, "tie_word_embeddings", False))
    text.multimodal = outer
    text.multimodal_config = config
    return text


def is_language_model_of_multimodal(config: Any) -> bool:
    """Whether `config` is a multimodal checkpoint's language model (language_model_config
    made it), whose weights are named as the multimodal model names them."""
    return getattr(config, "multimodal", None) is not None


def language_model_weight(name: str) -> str | None:
    """A multimodal checkpoint tensor's name in the causal model, or None for another tower's
    tensor (vision tower, projector), which is not read."""
    for prefix, replacement in _LANGUAGE_MODEL_PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    return None
