"""Start-up of speculative decoding: the draft model checked against the target (its
vocabulary is the target's, or its token ids would mean other tokens) and loaded before the
target's KV pool is sized, then the proposer the scheduler asks."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.contract.speculative import SpeculativeConfig
from tokenmill.engine.core.speculative.draft import DraftProposer
from tokenmill.engine.core.speculative.proposer import NgramProposer, Proposer
from tokenmill.engine.execution.draft_model import DraftModel, load_draft_model
from tokenmill.engine.models.loader import load_config, load_tokenizer
from tokenmill.engine.models.source import ModelLoadError, ModelNotFound, resolve_model

OPTION = "speculative_config"


def open_draft(speculative: SpeculativeConfig | None, config: EngineConfig,
               target_config: Any, target_tokenizer: Any, max_model_len: int,
               dtype: torch.dtype, device: torch.device,
               attention_backend: str) -> DraftModel | None:
    """The draft model on `device` when the method is "draft" (None otherwise); ConfigError
    naming speculative_config when it cannot be found or read, or is no draft for the target."""
    if speculative is None or speculative.method != "draft":
        return None
    try:
        source = resolve_model(speculative.model, config.download_dir,
                               ignore_patterns=config.ignore_patterns)
        draft_config = load_config(source)
        draft_tokenizer = load_tokenizer(source)
    except (ModelNotFound, ModelLoadError) as exc:
        raise ConfigError(OPTION, f"draft model: {exc}") from None
    check_draft(draft_config, draft_tokenizer, target_config, target_tokenizer, max_model_len)
    return load_draft_model(source, draft_config, max_model_len, config.block_size, dtype,
                            device, attention_backend)


def check_draft(draft_config: Any, draft_tokenizer: Any, target_config: Any,
                target_tokenizer: Any, max_model_len: int) -> None:
    """ConfigError unless the draft shares the target's vocabulary (model and tokenizer) and
    reaches max_model_len."""
    draft_vocab, target_vocab = draft_config.vocab_size, target_config.vocab_size
    if draft_vocab != target_vocab or len(draft_tokenizer) != len(target_tokenizer):
        raise ConfigError(OPTION, f"the draft model's vocabulary ({draft_vocab} tokens, "
                                  f"tokenizer {len(draft_tokenizer)}) is not the target's "
                                  f"({target_vocab} tokens, tokenizer {len(target_tokenizer)}): "
                                  "a draft must share the target's tokenizer")
    positions = getattr(draft_config, "max_position_embeddings", None) or max_model_len
    if positions < max_model_len:
        raise ConfigError(OPTION, f"the draft model's context ({positions} tokens) is shorter "
                                  f"than max_model_len ({max_model_len})")


def make_proposer(speculative: SpeculativeConfig | None, draft: DraftModel | None,
                  num_blocks: int, max_model_len: int,
                  max_num_batched_tokens: int) -> Proposer | None:
    """The step's proposer; a draft's pool gets the target's number of blocks."""
    if speculative is None:
        return None
    if draft is None:
        return NgramProposer(speculative, max_model_len)
    return DraftProposer(speculative, max_model_len, draft.runner(num_blocks),
                         max_num_batched_tokens)
