"""/v1/embeddings (the pooling runner): every input is an engine request, batched with the
others; the reply lists their vectors in input order, as floats or base64 (little-endian
float32, which the openai client asks for and decodes by default)."""

from __future__ import annotations

import base64
import logging
import sys
import time
import uuid
from typing import Any

import numpy as np
import torch
from fastapi import Request
from fastapi.responses import JSONResponse

from tokenmill.engine.core import EmbeddingRequestOutput, PoolingParams
from tokenmill.engine.server.embeddings_protocol import EmbeddingRequest, PoolingInputs
from tokenmill.engine.server.errors import APIError, client_closed
from tokenmill.engine.server.openai_serving import (
    chat_ids,
    check_serving,
    collect,
    start_requests,
    truncated,
)
from tokenmill.engine.server.request_template import request_template
from tokenmill.engine.server.state import ServerState

log = logging.getLogger(__name__)


async def create_embedding(body: EmbeddingRequest, request: Request,
                           state: ServerState) -> Any:
    check_serving(state, body.model, task="embed")
    prompts = [truncated(ids, body.truncate_prompt_tokens, state)
               for ids in prompt_ids(body, state)]
    pooling = PoolingParams(dimensions=body.dimensions, normalize=body.normalize)
    call_id = f"embd-{uuid.uuid4().hex}"
    finals = await embed(state, request, call_id, prompts, pooling, "input", body.priority)
    if finals is None:
        return client_closed()
    data = [{"object": "embedding", "index": i,
             "embedding": encoded(out.embedding or [], body.encoding_format, body.embed_dtype,
                                  body.endianness)}
            for i, out in enumerate(finals)]
    return pooled_reply(call_id, state, data, finals)


def pooled_reply(call_id: str, state: ServerState, data: list[dict],
                 finals: list[EmbeddingRequestOutput]) -> JSONResponse:
    """A pooling route's list reply: `data` in input order and the prompts' token usage."""
    tokens = sum(len(out.prompt_token_ids) for out in finals)
    return JSONResponse({"id": call_id, "object": "list", "created": int(time.time()),
                         "model": state.options.served_model_name, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def embed(state: ServerState, request: Request, call_id: str, prompts: list[list[int]],
                pooling: PoolingParams | list[PoolingParams], field: str,
                priority: int = 0) -> list[EmbeddingRequestOutput] | None:
    """Every prompt pooled (embedded, or classified under PoolingParams' task classify; with
    a list, each prompt under its own params), batched as one call's engine requests; None if
    the client went away first."""
    each = pooling if isinstance(pooling, list) else [pooling] * len(prompts)
    streams = await start_requests(
        state, [(f"{call_id}-{i}", ids, {"params": None, "pooling": p, "priority": priority})
                for i, (ids, p) in enumerate(zip(prompts, each, strict=True))], field)
    log.info("request admitted", extra={"id": call_id, "prompts": len(prompts)})
    return await collect(streams, request, state)


def prompt_ids(body: PoolingInputs, state: ServerState) -> list[list[int]]:
    """Each input's token ids, or the conversation's (rendered by the chat template)."""
    if body.messages is not None:
        try:
            return [chat_ids(state, body.conversation(),
                             add_generation_prompt=body.add_generation_prompt,
                             continue_final_message=body.continue_final_message,
                             template_kwargs=body.chat_template_kwargs,
                             add_special_tokens=bool(body.add_special_tokens),
                             chat_template=request_template(body, state),
                             documents=body.documents)]
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", param="messages") from exc
    special = body.add_special_tokens is not False
    return [state.tokenizer.encode(item, add_special_tokens=special)
            if isinstance(item, str) else item for item in body.inputs()]


# vLLM's embed_dtype: the element type of a base64 vector.
EMBED_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def encoded(vector: list[float], encoding_format: str, embed_dtype: str = "float32",
            endianness: str = "native") -> list[float] | str:
    """A vector as a reply carries it: floats, or base64 of its values as `embed_dtype` in
    the byte order `endianness` names (native: this machine's), as vLLM writes them."""
    if encoding_format == "float":
        return vector
    values = torch.tensor(vector, dtype=torch.float32).to(EMBED_DTYPES[embed_dtype])
    size = values.element_size()
    data = values.view(torch.uint8).numpy().reshape(-1, size)
    if endianness not in ("native", sys.byteorder):
        data = data[:, ::-1]
    return base64.b64encode(np.ascontiguousarray(data).tobytes()).decode("ascii")
