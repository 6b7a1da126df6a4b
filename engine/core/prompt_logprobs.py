"""Prompt-token logprobs: how likely the model found each prompt token given the ones before it.

A request asks with `SamplingParams.prompt_logprobs=k` (vLLM's name; the OpenAI completions API
asks with echo and logprobs). They come from the prefill the request runs anyway: the hidden
state at position p scores prompt token p+1, so the step that computes a prompt chunk also
turns those rows into logprobs, in every step where the chunk lands (chunked prefill), and only
for the requests that ask. A sequence that asks skips the prefix cache until its prompt is
scored: a cached block has no hidden states left to score.

Here the core picks the rows of a step to score (rows_to_score) and files the scores under
their sequences (record); the execution layer computes them (execution/prompt_scores.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenmill.engine.execution.step_inputs import PromptRows

if TYPE_CHECKING:
    import torch

    from tokenmill.engine.core.request import Sequence


@dataclass
class PromptLogprobs:
    """A sequence's prompt logprobs so far, one entry per prompt token. The first token has
    none (nothing precedes it); an entry maps the token and the top-k to their logprobs, most
    likely first, and `ranks` holds the token's rank (1: the most likely)."""

    entries: list[dict[int, float] | None] = field(default_factory=lambda: [None])
    ranks: list[int | None] = field(default_factory=lambda: [None])

    def complete(self, prompt_len: int) -> bool:
        return len(self.entries) >= prompt_len


def new_prompt_logprobs(prompt_logprobs: int | None) -> PromptLogprobs | None:
    return None if prompt_logprobs is None else PromptLogprobs()


def needs_scoring(seq: Sequence) -> bool:
    """The sequence asks for prompt logprobs and not every prompt token is scored yet."""
    found = seq.prompt_logprobs
    return found is not None and not found.complete(len(seq.prompt_token_ids))


def _positions(seq: Sequence, num_new: int) -> range:
    """Positions of this step's tokens whose hidden state scores a prompt token not yet
    scored (a recompute after preemption scores nothing twice)."""
    found = seq.prompt_logprobs
    if found is None:
        return range(0)
    start = max(seq.num_computed_tokens, len(found.entries) - 1)
    return range(start, min(seq.num_computed_tokens + num_new, len(seq.prompt_token_ids) - 1))


def rows_to_score(scheduled: list[tuple[Sequence, int]]) -> PromptRows:
    """Which rows of a step (scheduled as the runner lays it out) score prompt tokens."""
    out = PromptRows()
    offset = 0
    for seq, num_new in scheduled:
        positions = _positions(seq, num_new)
        if positions:
            out.rows += [offset + p - seq.num_computed_tokens for p in positions]
            out.targets += seq.prompt_token_ids[positions.start + 1:positions.stop + 1]
            out.top_k = max(out.top_k, seq.params.prompt_logprobs or 0)
        offset += num_new
    return out


def record(scheduled: list[tuple[Sequence, int]], scored: torch.Tensor | None) -> None:
    """Append a step's scores to the sequences they belong to (one transfer to the host).

    Call before the step advances num_computed_tokens: the rows are found as rows_to_score
    found them."""
    if scored is None:
        return
    table = scored.tolist()
    top_k = (len(table[0]) - 2) // 2 if table else 0
    at = 0
    for seq, num_new in scheduled:
        positions = _positions(seq, num_new)
        found = seq.prompt_logprobs
        for p in positions:
            chosen, rank, *top = table[at]
            at += 1
            k = seq.params.prompt_logprobs or 0
            entry = {int(top[top_k + j]): top[j] for j in range(k)}
            entry[seq.prompt_token_ids[p + 1]] = chosen
            found.entries.append(dict(sorted(entry.items(), key=lambda kv: -kv[1])))
            found.ranks.append(int(rank))
