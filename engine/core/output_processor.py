"""After sampling: append the token, detokenize, apply stop conditions, report to the caller."""

from __future__ import annotations

import logging
from typing import Any

from tokenmill.engine.core.outputs import CompletionOutput, RequestOutput
from tokenmill.engine.core.request import Sequence
from tokenmill.engine.core.sampling_params import RequestOutputKind

log = logging.getLogger(__name__)


def append_token(seq: Sequence, token: int, logprobs: dict[int, float] | None,
                 eos_token_ids: set[int], max_model_len: int) -> None:
    """Add one sampled token to seq and set seq.finish_reason if it ends the sequence."""
    params = seq.params
    seq.output_token_ids.append(token)
    if logprobs is not None:
        seq.output_logprobs.append(logprobs)
    grammar_ran = seq.constraint is not None and seq.constraint.active
    if seq.constraint is not None and not seq.constraint.accept(token):
        # The sampler masks every token the grammar forbids, and lets the grammar win where the
        # request's other masks would leave it none: this is a bug. End the sequence rather
        # than let it continue outside its grammar.
        log.error("token outside the grammar",
                  extra={"request_id": seq.request_id, "token": token})
        seq.finish_reason = "abort"
        return
    if grammar_ran and not seq.constraint.active and not params.ignore_eos:
        seq.finish_reason = "stop"  # the grammar took its end: it wins over min_tokens
        return
    # vLLM's min_tokens: nothing but the length ends a sequence until it has more tokens
    # (the sampler masks its stop tokens until then).
    stops = len(seq.output_token_ids) > params.min_tokens
    if stops and not params.ignore_eos and token in eos_token_ids:
        seq.finish_reason = "stop"
        return
    if stops and token in params.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token
        return
    before = len(seq.detokenizer.text)
    if params.detokenize and seq.detokenizer.append(token) and params.stop and stops:
        _apply_stop_strings(seq, before)
        if seq.finish_reason:
            return
    if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= max_model_len:
        seq.finish_reason = "length"


def _apply_stop_strings(seq: Sequence, before: int) -> None:
    """Cut the text at the first stop string that the new text completes."""
    text = seq.detokenizer.text
    longest = max(len(s) for s in seq.params.stop)
    search_from = max(0, before - longest + 1)
    hits = [(text.find(stop, search_from), stop) for stop in seq.params.stop]
    hits = [(at, stop) for at, stop in hits if at >= 0]
    if hits:
        at, stop = min(hits)
        seq.detokenizer.text = text[:at + len(stop) if seq.params.include_stop_str_in_output
                                    else at]
        seq.finish_reason, seq.stop_reason = "stop", stop


def visible_text(seq: Sequence) -> str:
    """Text safe to show: while running, hold back a tail that may start a stop string."""
    text = seq.detokenizer.text
    if seq.finish_reason is None and seq.params.stop:
        hold = max(len(s) for s in seq.params.stop) - 1
        return text[:max(0, len(text) - hold)] if hold else text
    return text


def request_output(req: Any) -> RequestOutput:
    """The request's output as its output_kind asks: cumulative, or (DELTA) what each of its
    sequences added since the output before (noted on the sequences)."""
    delta = req.params.output_kind is RequestOutputKind.DELTA
    first = _nothing_sent(req)
    outputs = [_delta(seq) if delta else
               CompletionOutput(
                   index=seq.index,
                   text=visible_text(seq),
                   token_ids=list(seq.output_token_ids),
                   finish_reason=seq.finish_reason,
                   stop_reason=seq.stop_reason,
                   logprobs=(list(seq.output_logprobs) if seq.params.logprobs is not None
                             else None),
               )
               for seq in req.seqs]
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=None if req.embeds is not None else req.prompt_token_ids,
        num_prompt_embeds=0 if req.embeds is None else len(req.embeds),
        outputs=outputs,
        finished=req.finished,
        timings=req.timings,
        num_preemptions=sum(seq.num_preemptions for seq in req.seqs),
        num_cached_tokens=req.seqs[0].num_cached_prompt_tokens,
        embedding=req.seqs[0].embedding,
        **(_prompt_logprobs(req.seqs[0]) if first or not delta else {}),
    )


def delta_due(req: Any, interval: int) -> bool:
    """Whether a running request that asks for deltas is reported this step: under a stream
    interval of N, at its first output, then once one of its sequences holds N tokens not
    sent."""
    if interval == 1 or _nothing_sent(req):
        return True
    return any(len(seq.output_token_ids) - seq.sent_tokens >= interval for seq in req.seqs)


def _nothing_sent(req: Any) -> bool:
    return not req.seqs[0].sent_tokens and not req.seqs[0].sent_text


def _delta(seq: Sequence) -> CompletionOutput:
    """What seq added since its last output; it is then counted as sent."""
    text = visible_text(seq)
    start = seq.sent_tokens
    out = CompletionOutput(
        index=seq.index, text=text[seq.sent_text:], token_ids=seq.output_token_ids[start:],
        finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
        logprobs=seq.output_logprobs[start:] if seq.params.logprobs is not None else None)
    seq.sent_tokens, seq.sent_text = len(seq.output_token_ids), len(text)
    return out


def _prompt_logprobs(seq: Sequence) -> dict[str, Any]:
    """The prompt's scores, shared, not copied: they are complete before any output is made
    and never change after."""
    found = seq.prompt_logprobs
    if found is None:
        return {}
    return {"prompt_logprobs": found.entries, "prompt_logprob_ranks": found.ranks}
