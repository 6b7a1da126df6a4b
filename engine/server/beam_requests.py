"""vLLM's `use_beam_search` on /v1/completions and /v1/chat/completions: the call's n choices
are the n best hypotheses of a beam search of width n (transformers' rules:
core/beam_search.py), best first. A search is read as a request's stream is, so the replies,
streamed or not, are rendered as any other; a stream sends each choice whole, at the end.

Beam search ranks tokens by the model's own log-probabilities: temperature, top_p, top_k,
min_p and seed change nothing (as in vLLM). What would change those log-probabilities or end a
beam otherwise than by an end token is refused with the field's name.
"""

from __future__ import annotations

from typing import Any

from tokenmill.engine.core import BeamSearchParams, SamplingParams
from tokenmill.engine.core.errors import SamplingParamsError
from tokenmill.engine.frontend.beam_search import BeamSearchStream, checked_prompt, new_search
from tokenmill.engine.server.errors import APIError, admission_error
from tokenmill.engine.server.rendering import Call
from tokenmill.engine.server.state import ServerState

# The settings beam search cannot honour, each with its neutral value (the user's field of
# the same name sets it).
_UNSUPPORTED = (("stop", []), ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                ("repetition_penalty", 1.0), ("logit_bias", None), ("allowed_token_ids", None),
                ("bad_words", None), ("prompt_logprobs", None))

def beam_params(body: Any, params: SamplingParams,
                constraint_field: str | None) -> BeamSearchParams | None:
    """The request's beam search (None without use_beam_search); a 400 naming the field that
    beam search cannot honour. `constraint_field` names what set the params' grammar."""
    if not body.use_beam_search:
        return None
    if params.structured_outputs is not None:
        raise APIError(400, f"{constraint_field}: not supported with use_beam_search",
                       param=constraint_field)
    for field, neutral in _UNSUPPORTED:
        value = getattr(params, field)
        if value is None or value == neutral or (isinstance(value, list | dict) and not value):
            continue
        if field == "prompt_logprobs" and getattr(body, "prompt_logprobs", None) is None:
            field = "echo"  # echo with logprobs scores the prompt
        raise APIError(400, f"{field}: not supported with use_beam_search", param=field)
    try:
        return BeamSearchParams(
            beam_width=params.n, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
            temperature=params.temperature, length_penalty=body.length_penalty,
            early_stopping=body.early_stopping, min_tokens=params.min_tokens,
            stop_token_ids=tuple(params.stop_token_ids))
    except SamplingParamsError as exc:
        raise APIError(400, str(exc), param=str(exc).split(":")[0]) from exc


async def start_beam_searches(call: Call, state: ServerState,
                              field: str) -> list[BeamSearchStream]:
    """One search per prompt of the call, each one's first round admitted; a prompt the
    engine refuses is a 400 naming `field` (or its own field), and no search is left running.
    One request in flight until the reply ends, as start_requests counts it."""
    core = state.engine.engine
    options = {"cache_salt": call.cache_salt, "lora_name": call.lora_name,
               "priority": call.priority}

    def decode(tokens: list[int]) -> str:
        return state.tokenizer.decode(tokens,
                                      skip_special_tokens=call.params.skip_special_tokens)

    state.request_started()
    started: list[BeamSearchStream] = []
    try:
        for i, ids in enumerate(call.prompts_ids):
            search = new_search(core, call.beam, "n")
            checked_prompt(core, ids, call.beam)
            stream = BeamSearchStream(state.engine, f"{call.id}-{i}", ids, search, options,
                                      decode, call.params.logprobs)
            started.append(await stream.start())
    except BaseException as exc:
        for stream in started:
            await stream.aclose()
        state.request_ended()
        if (error := admission_error(exc, field)) is not None:
            raise error from exc
        raise
    return started
