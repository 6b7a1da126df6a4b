"""SageMaker's POST /invocations, as vLLM serves it: one path for every API the model
serves, the body's own fields choosing which (a chat's `messages`, a completion's `prompt`;
rerank's `query` and `documents`, score's `text_1` and `text_2`, else an embedding's or a
classification's `input`). The body is then validated and answered exactly as on its own
route."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from tokenmill.engine.server.classify import create_classification
from tokenmill.engine.server.embeddings import create_embedding
from tokenmill.engine.server.embeddings_protocol import ClassificationRequest, EmbeddingRequest
from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.openai_serving import create_chat_completion, create_completion
from tokenmill.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.engine.server.scores import create_rerank, create_score
from tokenmill.engine.server.scores_protocol import RerankRequest, ScoreRequest
from tokenmill.engine.server.state import ServerState

Handler = Callable[[Any, Request, ServerState], Awaitable[Any]]


def _route(body: dict[str, Any], task: str) -> tuple[type[BaseModel], Handler]:
    """The body's type and its route's handler, for a model served for `task`."""
    if task == "generate":
        if "messages" in body:
            return ChatCompletionRequest, create_chat_completion
        if "prompt" in body:
            return CompletionRequest, create_completion
        raise APIError(400, "an invocation of a generative model takes a chat completion's "
                            "body (messages) or a completion's (prompt)")
    if "query" in body and "documents" in body:
        return RerankRequest, create_rerank
    if "text_1" in body or "text_2" in body:
        return ScoreRequest, create_score
    if task == "classify":
        return ClassificationRequest, create_classification
    return EmbeddingRequest, create_embedding


async def invoke(request: Request, state: ServerState) -> Any:
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    kind, handler = _route(body, state.task)
    try:
        parsed = kind.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]) from None
    return await handler(parsed, request, state)
