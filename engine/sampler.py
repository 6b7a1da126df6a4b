"""Turn a step's logits into one token per sequence, each under its own SamplingParams.

Random draws use the exponential-race form of categorical sampling (argmax of p / Exp(1)) with
one generator per sequence: every step consumes the same number of draws from that generator
whatever else is in the batch, so a seeded request reproduces exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.engine.request import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
    """logits: [len(seqs), vocab] float32, one row per sequence."""
    raw_logprobs = None
    if any(s.params.logprobs is not None for s in seqs):
        raw_logprobs = torch.log_softmax(logits, dim=-1)
    logits = logits.clone()
    for row, seq in enumerate(seqs):
        if seq.params.has_penalties:
            apply_penalties(logits[row], seq)
    tokens = torch.empty(len(seqs), dtype=torch.long, device=logits.device)
    greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    randoms = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if randoms:
        probs = filtered_probs(logits[randoms], [seqs[i] for i in randoms])
        noise = torch.stack([
            torch.empty(probs.shape[1], device=probs.device).exponential_(
                generator=seqs[i].generator)
            for i in randoms
        ])
        tokens[randoms] = (probs / noise).argmax(dim=-1)
    token_ids = tokens.tolist()
    return SampleResult(token_ids, _logprobs(raw_logprobs, seqs, token_ids))


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """OpenAI presence/frequency penalties over the output; HF repetition penalty over all."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty,
                                   values * p.repetition_penalty)
    if seq.output_token_ids and (p.presence_penalty or p.frequency_penalty):
        out = torch.tensor(seq.output_token_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(out, minlength=logits.shape[0]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def filtered_probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masks; returns renormalized probabilities."""
    device = logits.device
    temperature = torch.tensor([s.params.temperature for s in seqs], device=device)
    logits = logits / temperature.unsqueeze(1)
    vocab = logits.shape[1]
    top_k = torch.tensor([s.params.top_k if s.params.top_k > 0 else vocab for s in seqs],
                         device=device)
    top_p = torch.tensor([s.params.top_p for s in seqs], device=device)
    min_p = torch.tensor([s.params.min_p for s in seqs], device=device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    rank = torch.arange(vocab, device=device).unsqueeze(0)
    drop = rank >= top_k.unsqueeze(1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop |= mass_before >= top_p.unsqueeze(1)
    drop |= sorted_probs < min_p.unsqueeze(1) * sorted_probs[:, :1]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    filtered = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    return filtered.softmax(dim=-1)


def _logprobs(raw: torch.Tensor | None, seqs: list[Sequence],
              token_ids: list[int]) -> list[dict[int, float] | None]:
    result: list[dict[int, float] | None] = []
    for row, seq in enumerate(seqs):
        k = seq.params.logprobs
        if raw is None or k is None:
            result.append(None)
            continue
        entry: dict[int, float] = {}
        if k > 0:
            values, ids = raw[row].topk(k)
            entry = dict(zip(ids.tolist(), values.tolist(), strict=True))
        entry[token_ids[row]] = float(raw[row, token_ids[row]])
        return_order = sorted(entry.items(), key=lambda kv: -kv[1])
        result.append(dict(return_order))
    return result
