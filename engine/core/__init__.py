"""The engine core: requests in, tokens out, one scheduled step at a time (scheduler, KV block
bookkeeping, sampler, outputs). It knows no HTTP and no Kubernetes.

Its public surface is what this package exports plus `errors`: the server and the frontends
import nothing else of the core. Names load lazily, so importing a light piece
(SamplingParams, StructuredOutputsParams) does not load the model machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenmill.engine.core import generation_config, prompt_truncation
    from tokenmill.engine.core.beam_search import (
        BeamSearch,
        BeamSearchOutput,
        BeamSearchParams,
        BeamSearchSequence,
        completion_outputs,
        round_params,
    )
    from tokenmill.engine.core.cross_encoding import (
        cosine_similarity,
        cut_pair_prompt,
        pair_prompt,
        score_pairs,
    )
    from tokenmill.engine.core.detokenizer import IncrementalDetokenizer
    from tokenmill.engine.core.engine import LLMEngine
    from tokenmill.engine.core.outputs import (
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingRequestOutput,
        PoolingOutput,
        PoolingRequestOutput,
        RequestOutput,
        ScoringOutput,
        ScoringRequestOutput,
    )
    from tokenmill.engine.core.pooling_params import PoolingParams
    from tokenmill.engine.core.sampling_params import RequestOutputKind, SamplingParams
    from tokenmill.engine.core.structured.params import StructuredOutputsParams

_EXPORTS = {
    **{name: "tokenmill.engine.core.beam_search"
       for name in ("BeamSearch", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence",
                    "completion_outputs", "round_params")},
    "LLMEngine": "tokenmill.engine.core.engine",
    "ClassificationRequestOutput": "tokenmill.engine.core.outputs",
    "CompletionOutput": "tokenmill.engine.core.outputs",
    "EmbeddingRequestOutput": "tokenmill.engine.core.outputs",
    "PoolingOutput": "tokenmill.engine.core.outputs",
    "PoolingRequestOutput": "tokenmill.engine.core.outputs",
    "ScoringOutput": "tokenmill.engine.core.outputs",
    "ScoringRequestOutput": "tokenmill.engine.core.outputs",
    "cosine_similarity": "tokenmill.engine.core.cross_encoding",
    "cut_pair_prompt": "tokenmill.engine.core.cross_encoding",
    "IncrementalDetokenizer": "tokenmill.engine.core.detokenizer",
    "pair_prompt": "tokenmill.engine.core.cross_encoding",
    "score_pairs": "tokenmill.engine.core.cross_encoding",
    "RequestOutput": "tokenmill.engine.core.outputs",
    "PoolingParams": "tokenmill.engine.core.pooling_params",
    "SamplingParams": "tokenmill.engine.core.sampling_params",
    "RequestOutputKind": "tokenmill.engine.core.sampling_params",
    "StructuredOutputsParams": "tokenmill.engine.core.structured.params",
}

__all__ = ["BeamSearch", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence",
           "ClassificationRequestOutput", "CompletionOutput", "EmbeddingRequestOutput",
           "IncrementalDetokenizer", "LLMEngine", "PoolingOutput", "PoolingParams",
           "PoolingRequestOutput",
           "RequestOutput", "RequestOutputKind", "SamplingParams",
           "ScoringOutput", "ScoringRequestOutput", "StructuredOutputsParams", "cosine_similarity",
           "completion_outputs", "cut_pair_prompt", "generation_config", "pair_prompt",
           "prompt_truncation", "round_params", "score_pairs"]


def __getattr__(name: str) -> Any:
    if name in ("prompt_truncation", "generation_config"):
        return importlib.import_module(f"tokenmill.engine.core.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
