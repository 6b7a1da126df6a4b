"""Prompt-token logprobs: how likely the model found each prompt token given the ones before it.

A request asks with `SamplingParams.prompt_logprobs=k` (vLLM's name; the OpenAI completions API
asks with echo and logprobs). They come from the prefill the request runs anyway: the hidden
state at position p scores prompt token p+1, so the step that computes a prompt chunk also
turns those rows into logprobs, in every step where the chunk lands (chunked prefill), and only
for the requests that ask. A sequence that asks skips the prefix cache until its prompt is
scored: a cached block has no hidden states left to score.

Rows are projected to the vocabulary ROWS_PER_SLICE at a time and reduced on the device to
what is returned (the token's logprob and rank, the top-k), so a long prompt never holds
[prompt, vocab] logits at once. Every tensor-parallel rank runs the same slices: the LM head
gathers its vocabulary shards with a collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tokenmill.engine.models.decoder import CausalLM
    from tokenmill.engine.request import Sequence

ROWS_PER_SLICE = 256  # [256, vocab] float32 logits at a time: 128 MiB at a 128k vocabulary


@dataclass
class PromptLogprobs:
    """A sequence's prompt logprobs so far, one entry per prompt token. The first token has
    none (nothing precedes it); an entry maps the token and the top-k to their logprobs, most
    likely first, and `ranks` holds the token's rank (1: the most likely)."""

    entries: list[dict[int, float] | None] = field(default_factory=lambda: [None])
    ranks: list[int | None] = field(default_factory=lambda: [None])

    def complete(self, prompt_len: int) -> bool:
        return len(self.entries) >= prompt_len


@dataclass
class PromptRows:
    """The rows of one step to score, in plain lists (sent to every tensor-parallel rank)."""

    rows: list[int] = field(default_factory=list)     # flat token rows of the step
    targets: list[int] = field(default_factory=list)  # the prompt token each row scores
    top_k: int = 0                                     # the most any of their requests asks


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


def score_rows(model: CausalLM, hidden: torch.Tensor, rows: PromptRows) -> torch.Tensor:
    """[len(rows), 2 + 2 * top_k] float64 on the device: each row's target logprob, its rank,
    then the top-k logprobs and their token ids (exact in float64)."""
    index = torch.tensor(rows.rows, device=hidden.device)
    targets = torch.tensor(rows.targets, device=hidden.device).unsqueeze(1)
    parts = []
    for start in range(0, len(rows.rows), ROWS_PER_SLICE):
        stop = start + ROWS_PER_SLICE
        logprobs = torch.log_softmax(model.logits(hidden[index[start:stop]]), dim=-1)
        chosen = logprobs.gather(1, targets[start:stop])
        rank = (logprobs > chosen).sum(dim=1, keepdim=True) + 1
        slice_parts = [chosen.double(), rank.double()]
        if rows.top_k:
            values, ids = logprobs.topk(rows.top_k, dim=-1)
            slice_parts += [values.double(), ids.double()]
        parts.append(torch.cat(slice_parts, dim=1))
    return torch.cat(parts)


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
