"""vLLM's /score and the rerank API under the pooling runner. An embedding model embeds each
text once, and a pair's score is the cosine similarity of its two embeddings; a cross-encoder
(a sequence classifier with one label) reads each pair as one prompt, and its score is the
label's probability; as vLLM scores with either. Rerank returns the documents best first."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tokenmill.engine.core import PoolingParams, cosine_similarity, cut_pair_prompt
from tokenmill.engine.server.embeddings import embed
from tokenmill.engine.server.errors import APIError, client_closed
from tokenmill.engine.server.openai_serving import (
    check_serving,
    truncated,
)
from tokenmill.engine.server.scores_protocol import RerankRequest, ScoreRequest, ScoringFields
from tokenmill.engine.server.state import ServerState


async def create_score(body: ScoreRequest, request: Request, state: ServerState) -> Any:
    pairs = body.pairs()
    scored = await _scores(body, request, state, pairs, "score", "text_1")
    if scored is None:
        return client_closed()
    call_id, scores, tokens = scored
    data = [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)]
    return JSONResponse({"id": call_id, "object": "list", "created": int(time.time()),
                         "model": state.options.served_model_name, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def create_rerank(body: RerankRequest, request: Request, state: ServerState) -> Any:
    pairs = [(body.query, text) for text in body.texts()]
    scored = await _scores(body, request, state, pairs, "rerank", "documents")
    if scored is None:
        return client_closed()
    call_id, scores, tokens = scored
    best = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.count]
    results = [{"index": i, "document": body.shown(i), "relevance_score": scores[i]}
               for i in best]
    return JSONResponse({"id": call_id, "model": state.options.served_model_name,
                         "usage": {"total_tokens": tokens}, "results": results})


async def _scores(body: ScoringFields, request: Request, state: ServerState,
                  pairs: list[tuple[str, str]], kind: str,
                  field: str) -> tuple[str, list[float], int] | None:
    """The call's id, each pair's score and the tokens read; None if the client went
    away."""
    if state.task == "classify":
        return await _cross_encoded(body, request, state, pairs, kind, field)
    check_serving(state, body.model, task="embed")
    texts = list(dict.fromkeys(text for pair in pairs for text in pair))
    prompts = [truncated(state.tokenizer.encode(text), body.truncate_prompt_tokens, state)
               for text in texts]
    call_id = f"{kind}-{uuid.uuid4().hex}"
    finals = await embed(state, request, call_id, prompts, PoolingParams(), field,
                         body.priority)
    if finals is None:
        return None
    vectors = dict(zip(texts, (out.embedding for out in finals), strict=True))
    scores = [cosine_similarity(vectors[a], vectors[b]) for a, b in pairs]
    return call_id, scores, sum(len(ids) for ids in prompts)


async def _cross_encoded(body: ScoringFields, request: Request, state: ServerState,
                         pairs: list[tuple[str, str]], kind: str,
                         field: str) -> tuple[str, list[float], int] | None:
    """A cross-encoder's scores: each pair one prompt, its score the one label's
    probability."""
    check_serving(state, body.model, task="classify")
    labels = state.classifier.labels
    if len(labels) != 1:
        raise APIError(400, f"the model {state.options.served_model_name!r} is a classifier "
                            f"with {len(labels)} labels: scoring needs one (a cross-encoder); "
                            "use /classify", param="model")
    pooling = PoolingParams(task="classify", use_activation=body.use_activation)
    prompts, each = [], []
    for a, b in pairs:
        ids, types = cut_pair_prompt(state.tokenizer, a, b, state.classifier,
                                     body.truncate_prompt_tokens, state.max_model_len)
        prompts.append(ids)
        each.append(dataclasses.replace(
            pooling, token_type_ids=None if types is None else list(types)))
    call_id = f"{kind}-{uuid.uuid4().hex}"
    finals = await embed(state, request, call_id, prompts, each, field, body.priority)
    if finals is None:
        return None
    return call_id, [out.embedding[0] for out in finals], sum(len(ids) for ids in prompts)
