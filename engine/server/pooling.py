"""vLLM's /pooling: the pooling runner's raw output for each input, whichever task the model is
served for (an embedding model's vector, as /v1/embeddings gives it; a classifier's
probabilities, or logits with use_activation false, as /classify gives them)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import Request

from tokenmill.engine.core import PoolingParams
from tokenmill.engine.server.embeddings import embed, encoded, pooled_reply, prompt_ids
from tokenmill.engine.server.embeddings_protocol import PoolingRequest
from tokenmill.engine.server.errors import APIError, client_closed
from tokenmill.engine.server.openai_serving import check_serving, truncated
from tokenmill.engine.server.state import ServerState


async def create_pooling(body: PoolingRequest, request: Request, state: ServerState) -> Any:
    # A generative model serves neither task: refused as /v1/embeddings refuses it.
    task = state.task if state.task != "generate" else "embed"
    check_serving(state, body.model, task=task)
    if body.task is not None and body.task != task:
        raise APIError(400, f"task: the model pools for {task}, not {body.task}", param="task")
    prompts = [truncated(ids, body.truncate_prompt_tokens, state)
               for ids in prompt_ids(body, state)]
    pooling = PoolingParams(task=task, use_activation=body.use_activation) \
        if task == "classify" else PoolingParams(dimensions=body.dimensions,
                                                 normalize=body.normalize)
    call_id = f"pool-{uuid.uuid4().hex}"
    finals = await embed(state, request, call_id, prompts, pooling, "input", body.priority)
    if finals is None:
        return client_closed()
    data = [{"index": i, "object": "pooling",
             "data": encoded(out.embedding or [], body.encoding_format, body.embed_dtype,
                             body.endianness)}
            for i, out in enumerate(finals)]
    return pooled_reply(call_id, state, data, finals)
