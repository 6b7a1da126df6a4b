"""vLLM's /classify (a sequence classifier, the pooling runner): every input is an engine
request, batched with the others; each comes back as its labels' probabilities and the most
likely label's name (with use_activation false, its logits in place of the probabilities)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tokenmill.engine.core import PoolingParams
from tokenmill.engine.server.embeddings import embed, prompt_ids
from tokenmill.engine.server.embeddings_protocol import ClassificationRequest
from tokenmill.engine.server.errors import client_closed
from tokenmill.engine.server.openai_serving import check_serving, truncated
from tokenmill.engine.server.state import ServerState


async def create_classification(body: ClassificationRequest, request: Request,
                                state: ServerState) -> Any:
    check_serving(state, body.model, task="classify")
    prompts = [truncated(ids, body.truncate_prompt_tokens, state)
               for ids in prompt_ids(body, state)]
    call_id = f"classify-{uuid.uuid4().hex}"
    pooling = PoolingParams(task="classify", use_activation=body.use_activation)
    finals = await embed(state, request, call_id, prompts, pooling, "input", body.priority)
    if finals is None:
        return client_closed()
    labels = state.classifier.labels
    data = []
    for i, out in enumerate(finals):
        probs = out.embedding or []
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": labels[best], "probs": probs,
                     "num_classes": len(probs)})
    tokens = sum(len(out.prompt_token_ids) for out in finals)
    return JSONResponse({"id": call_id, "object": "list", "created": int(time.time()),
                         "model": state.options.served_model_name, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                                   "completion_tokens": 0, "prompt_tokens_details": None}})
