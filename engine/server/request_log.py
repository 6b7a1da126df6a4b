"""--enable-log-requests: one INFO line per engine request at admission, as vLLM's request log:
its id, model, prompt length, the sampling parameters a request changed and its prompt text (a
chat's as its template rendered it), cut to --max-log-len. --enable-log-outputs: one line per
generation once it finishes, under the same id: its finish reason, text and token ids, cut the
same way; and a line for what each step of a stream added, unless --no-enable-log-deltas.

The lines go to the `tokenmill.requests` logger, which the flag sets to INFO whatever
TOKENMILL_LOG_LEVEL says: turning request logs on should not turn on every other INFO line.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tokenmill.engine.core import RequestOutput, SamplingParams
from tokenmill.engine.server.rendering import Call, prompt_text
from tokenmill.engine.server.state import ServerState

log = logging.getLogger("tokenmill.requests")
_DEFAULTS = SamplingParams()


def enable_request_log() -> None:
    log.setLevel(logging.INFO)


def log_request(call: Call, state: ServerState) -> None:
    options = state.options
    if not options.log_requests:
        return
    for i, ids in enumerate(call.prompts_ids):
        prompt = prompt_text(call, state, i)
        log.info("request received", extra={
            "id": f"{call.id}-{i}", "model": call.model, "prompt_tokens": len(ids),
            "params": changed_params(call.params),
            "prompt": prompt[:options.max_log_len] if options.max_log_len else prompt,
        })


def log_output(out: RequestOutput, state: ServerState, delta: bool = False) -> None:
    """A finished request's generations (an embedding's vector is not logged), or with
    `delta` what one step of a stream added (--enable-log-deltas, on by default as vLLM's)."""
    options = state.options
    if not options.log_outputs or out.embedding is not None or (delta and not
                                                                 options.log_deltas):
        return
    cut = options.max_log_len
    for c in out.outputs:
        log.info("response delta" if delta else "response finished", extra={
            "id": out.request_id, **({"index": c.index} if len(out.outputs) > 1 else {}),
            "finish_reason": c.finish_reason, "output_tokens": len(c.token_ids),
            "output": c.text[:cut] if cut else c.text,
            "output_token_ids": c.token_ids[:cut] if cut else c.token_ids,
        })


def changed_params(params: SamplingParams) -> dict[str, Any]:
    """The sampling fields that differ from SamplingParams' defaults, by name."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
            if f.compare and getattr(params, f.name) != getattr(_DEFAULTS, f.name)}
