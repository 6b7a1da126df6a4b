"""Turn a step's logits into one token per sequence, each under its own SamplingParams.

Everything runs on the logits' device and the step's results (token ids, and logprobs where a
request asks for them) come back to the host in one transfer: on a GPU each transfer waits for
all the work queued before it. `sample_later` starts that transfer without waiting for it (async
scheduling: the host works on the previous step while the device computes this one).

Random draws use the exponential-race form of categorical sampling (argmax of p / Exp(1)) on a
GPU, and the inverse of the cumulative distribution (one uniform a row) on a CPU. A seeded
request draws from its own generator: every step consumes the same number of draws from it
whatever else is in the batch, so it reproduces exactly. Unseeded requests share the engine's
generator and draw in one call. Temperature, top-k, top-p and min-p narrow a row to its
candidate tokens first (sampling_filters.py), whose noise alone an unseeded row draws.

Before sampling, rows that ask for it get their logit_bias added, their penalties applied,
their banned tokens masked (stop tokens while short of min_tokens, the next token of a bad
word), everything outside allowed_token_ids masked and, when constrained, the grammar's token
mask (-inf outside the allowed set; structured/): on a copy of the logits, touching only those
rows, so constrained and free requests share one step. Logprobs are those of the model's raw
logits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.core.request import RequestTimings, Sequence
from tokenmill.engine.core.sampling_filters import candidates, filters_any
from tokenmill.engine.core.sampling_params import SamplingParams
from tokenmill.engine.core.structured import bitmask
from tokenmill.engine.layers.to_device import list_to_device

# Devices that draw a row by the inverse of its cumulative distribution (_drawn_tokens).
INVERSE_CDF_DEVICES = ("cpu",)


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


class PendingSample:
    """A step's sampled tokens: on the device (`tokens`, one per row), and on their way to the
    host with the logprobs asked for; `result()` waits for them there."""

    def __init__(self, tokens: torch.Tensor, packed: torch.Tensor, max_k: int,
                 seqs: list[Sequence]):
        self.tokens = tokens
        self._seqs, self._max_k = seqs, max_k
        self._ready: torch.cuda.Event | None = None
        if packed.device.type == "cuda":
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = packed

    def result(self) -> SampleResult:
        if self._ready is not None:
            self._ready.synchronize()
        return _unpack(self._host.tolist(), self._seqs, self._max_k)


def sample(logits: torch.Tensor, seqs: list[Sequence],
           generator: torch.Generator | None = None,
           eos_token_ids: Collection[int] = (),
           logprobs_mode: str = "raw_logprobs") -> SampleResult:
    """logits: [len(seqs), vocab] float32, one row per sequence; `generator` draws the noise of
    sequences without their own (None: torch's default generator); `eos_token_ids` are masked
    for sequences still short of their min_tokens; `logprobs_mode` (vLLM's) says what a
    request's logprobs report."""
    tokens, reported = _draw(logits, seqs, generator, eos_token_ids, logprobs_mode)
    packed, max_k = _pack(tokens, reported, seqs)
    return _unpack(packed.tolist(), seqs, max_k)


def sample_later(logits: torch.Tensor, seqs: list[Sequence],
                 generator: torch.Generator | None = None,
                 eos_token_ids: Collection[int] = (),
                 logprobs_mode: str = "raw_logprobs") -> PendingSample:
    """`sample`, with the host copy started but not waited for."""
    tokens, reported = _draw(logits, seqs, generator, eos_token_ids, logprobs_mode)
    return PendingSample(tokens, *_pack(tokens, reported, seqs), seqs)


def _draw(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator | None,
          eos_token_ids: Collection[int], logprobs_mode: str = "raw_logprobs",
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's token on the device, and what logprobs report where some row asks for them
    (vLLM's modes): the model's logits or their log-softmax ("raw_"), or those the token was
    drawn from ("processed_": after logit_bias, penalties and masks, and for a sampled row
    temperature, top-k, top-p and min-p, a token they rule out at -inf)."""
    asked = any(s.params.logprobs is not None for s in seqs)
    reported = None
    if asked and logprobs_mode == "raw_logprobs":
        reported = torch.log_softmax(logits, dim=-1)
    elif asked and logprobs_mode == "raw_logits":
        reported = logits
    logits = _processed(logits, seqs, eos_token_ids)
    tokens = logits.argmax(dim=-1)
    drawn_from = logits  # a greedy row's: processed, no temperature
    randoms = [i for i, s in enumerate(seqs) if not s.params.greedy]
    # Rows with top-k, top-p or min-p draw from their candidates, the others from the whole
    # vocabulary: a group each, so a row without filters makes no other row sort the vocabulary.
    groups = [[i for i in randoms if filters_any(seqs[i].params) == filtered]
              for filtered in (False, True)]
    for group in (g for g in groups if g):
        every_row = len(group) == len(seqs)
        rows = None if every_row else list_to_device(group, torch.long, logits.device)
        chosen = [seqs[i] for i in group]
        kept = candidates(logits if rows is None else logits[rows], [s.params for s in chosen])
        drawn = _drawn_tokens(kept.logits.softmax(dim=-1), kept.ids, chosen, generator,
                              logits.shape[1])
        tokens = drawn if rows is None else tokens.index_copy(0, rows, drawn)
        if asked and logprobs_mode.startswith("processed_"):
            filtered = kept.scattered(logits.shape[1])
            drawn_from = filtered if rows is None else drawn_from.index_copy(0, rows, filtered)
    if asked and logprobs_mode == "processed_logits":
        reported = drawn_from
    elif asked and logprobs_mode == "processed_logprobs":
        reported = torch.log_softmax(drawn_from, dim=-1)
    return tokens, reported


def _processed(logits: torch.Tensor, seqs: list[Sequence],
               eos_token_ids: Collection[int] = ()) -> torch.Tensor:
    """logit_bias, penalties, min_tokens' stop masks, then grammar masks, on a copy; the
    logits as they are when no row asks for any of them."""
    biased = [row for row, s in enumerate(seqs) if s.params.logit_bias]
    penalized = [row for row, s in enumerate(seqs) if s.params.has_penalties]
    banned = [(row, ids) for row, s in enumerate(seqs)
              if (ids := banned_tokens(s, eos_token_ids))]
    allowed = [row for row, s in enumerate(seqs) if s.params.allowed_token_ids]
    constrained = [row for row, s in enumerate(seqs)
                   if s.constraint is not None and s.constraint.active]
    if not (biased or penalized or banned or allowed or constrained):
        return logits
    masks = None
    if constrained:  # host work first: on a GPU it overlaps the forward still queued
        masks = bitmask.fill([(row, seqs[row].constraint) for row in constrained], len(seqs),
                             logits.shape[1], logits.device)
        # A grammar left only tokens the row bans (it can only end, and min_tokens masks EOS):
        # the grammar wins, else the row would have no token to draw.
        ruled = set(constrained)
        # Likewise where the grammar allows none of allowed_token_ids that is not banned here
        # (they met at the first step, which admission checks): the grammar wins.
        bans = dict(banned)
        allowed = [row for row in allowed if row not in ruled or bitmask.allows_any(
            masks[row], set(seqs[row].params.allowed_token_ids) - set(bans.get(row, ())))]
        banned = [(row, ids) for row, ids in banned
                  if row not in ruled or not bitmask.allows_only(masks[row], ids)]
    logits = logits.clone()
    if biased:
        apply_logit_bias(logits, [(row, seqs[row].params.logit_bias) for row in biased])
    for row in penalized:
        apply_penalties(logits[row], seqs[row])
    if banned:  # a bias of -inf: the token can't be drawn
        apply_logit_bias(logits, [(row, dict.fromkeys(ids, float("-inf"))) for row, ids in banned])
    for row in allowed:
        keep = list_to_device(seqs[row].params.allowed_token_ids, torch.long, logits.device)
        logits[row] = torch.full_like(logits[row], float("-inf")).index_copy_(
            0, keep, logits[row].index_select(0, keep))
    if masks is not None:
        bitmask.apply(logits, masks, constrained)
    return logits


def apply_logit_bias(logits: torch.Tensor, biases: list[tuple[int, dict[int, float]]]) -> None:
    """In place: each row's {token id: bias} added to its logits, all rows in one scatter-add."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, bias in biases:
        rows += [row] * len(bias)
        cols += bias.keys()
        values += bias.values()
    index = list_to_device([rows, cols], torch.long, logits.device)
    bias = list_to_device(values, logits.dtype, logits.device)
    logits.index_put_((index[0], index[1]), bias, accumulate=True)


def banned_tokens(seq: Sequence, eos_token_ids: Collection[int]) -> list[int]:
    """The tokens this sequence may not sample next: while short of min_tokens, those that
    would end it (stop_token_ids, EOS unless ignored); and the last token of each bad word
    whose other tokens the output ends with."""
    params = seq.params
    short = len(seq.output_token_ids) < params.min_tokens
    if not short and not seq.bad_word_ids:  # the usual case: nothing to ban
        return []
    banned: set[int] = set()
    if short:
        banned.update(params.stop_token_ids)
        if not params.ignore_eos:
            banned.update(eos_token_ids)
    for word in seq.bad_word_ids:
        before = len(word) - 1
        if before == 0 or seq.output_token_ids[-before:] == word[:-1]:
            banned.add(word[-1])
    return sorted(banned)


def _drawn_tokens(probs: torch.Tensor, ids: torch.Tensor | None, seqs: list[Sequence],
                  generator: torch.Generator | None, vocab: int) -> torch.Tensor:
    """Each row's token drawn from its candidates' probabilities (`ids`: their token ids; None:
    the whole vocabulary in order). On a CPU by the inverse of the cumulative distribution over
    the candidates in token order, so the draw does not depend on how many candidates a batch
    took (one uniform a row: an exponential costs a logarithm, and the race draws one for every
    candidate); elsewhere by the exponential race, whose noise a GPU draws in microseconds."""
    if probs.device.type not in INVERSE_CDF_DEVICES:
        noise = _exponential_noise(probs, ids, seqs, generator, vocab)
        column = (probs / noise).argmax(dim=-1, keepdim=True)
        return column[:, 0] if ids is None else ids.gather(1, column)[:, 0]
    if ids is not None and ids.shape[1] == vocab:  # sorted by probability: back in place
        probs, ids = probs.new_zeros(probs.shape).scatter_(1, ids, probs), None
    elif ids is not None:
        order = ids.argsort(dim=-1)
        probs, ids = probs.gather(1, order), ids.gather(1, order)
    uniform = torch.empty(len(seqs), dtype=torch.float64)
    shared = [j for j, s in enumerate(seqs) if s.generator is None]
    if shared:
        uniform[shared] = torch.rand(len(shared), generator=generator, dtype=torch.float64)
    for j, seq in enumerate(seqs):
        if seq.generator is not None:
            uniform[j] = torch.rand(1, generator=seq.generator, dtype=torch.float64)
    # In float64, so rounding neither skews the draw nor reaches past the last token; a token of
    # probability 0 adds exactly 0, so no point falls on it.
    cumulative = probs.double().cumsum(dim=-1)
    points = (uniform * cumulative[:, -1]).unsqueeze(1)
    column = torch.searchsorted(cumulative, points, right=True).clamp(max=probs.shape[1] - 1)
    return column[:, 0] if ids is None else ids.gather(1, column)[:, 0]


def _exponential_noise(probs: torch.Tensor, ids: torch.Tensor | None, seqs: list[Sequence],
                       generator: torch.Generator | None, vocab: int) -> torch.Tensor:
    """Exp(1) noise for each row's candidates (`ids`: their token ids; None: the whole
    vocabulary). A seeded row draws one value per token of the vocabulary from its own
    generator, however few its candidates, so its draws never depend on the batch."""
    noise = torch.empty_like(probs)
    shared = [j for j, s in enumerate(seqs) if s.generator is None]
    if len(shared) == len(seqs):
        return noise.exponential_(generator=generator)
    if shared:
        rows = list_to_device(shared, torch.long, probs.device)
        block = torch.empty(len(shared), probs.shape[1], device=probs.device)
        noise.index_copy_(0, rows, block.exponential_(generator=generator))
    for j, seq in enumerate(seqs):
        if seq.generator is not None:
            own = torch.empty(vocab, device=probs.device).exponential_(generator=seq.generator)
            noise[j] = own if ids is None else own[ids[j]]
    return noise


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """OpenAI presence/frequency penalties over the output; HF repetition penalty over all."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = list_to_device(sorted(set(seq.known_token_ids)), torch.long, logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty,
                                   values * p.repetition_penalty)
    if seq.output_token_ids and (p.presence_penalty or p.frequency_penalty):
        out = list_to_device(seq.output_token_ids, torch.long, logits.device)
        # Counted by scatter_add: on CUDA bincount reads the largest id back to the host.
        ones = torch.ones_like(out, dtype=logits.dtype)
        counts = torch.zeros_like(logits).scatter_add_(0, out, ones)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _pack(tokens: torch.Tensor, raw: torch.Tensor | None,
          seqs: list[Sequence]) -> tuple[torch.Tensor, int]:
    """What one device-to-host copy brings back, and the most top logprobs a row asks for:
    the token ids, then (when asked) each row's sampled-token logprob and its top-k, packed as
    float64 (token ids are exact in it). max_k is -1 without logprobs."""
    if raw is None:
        return tokens, -1
    max_k = max(s.params.logprobs or 0 for s in seqs)
    parts = [tokens.double(), raw.gather(1, tokens.unsqueeze(1)).squeeze(1).double()]
    if max_k:
        values, ids = raw.topk(max_k, dim=-1)
        parts += [values.double().flatten(), ids.double().flatten()]
    return torch.cat(parts), max_k


def _unpack(flat: list[Any], seqs: list[Sequence], max_k: int) -> SampleResult:
    """The SampleResult of a _pack'ed copy, read back as a list."""
    n = len(seqs)
    if max_k < 0:
        return SampleResult(flat, [None] * n)
    token_ids = [int(t) for t in flat[:n]]
    chosen = flat[n:2 * n]
    top_values, top_ids = flat[2 * n:2 * n + n * max_k], flat[2 * n + n * max_k:]
    logprobs: list[dict[int, float] | None] = []
    for row, seq in enumerate(seqs):
        k = seq.params.logprobs
        if k is None:
            logprobs.append(None)
            continue
        base = row * max_k
        entry = {int(top_ids[base + j]): top_values[base + j] for j in range(k)}
        entry[token_ids[row]] = chosen[row]
        logprobs.append(dict(sorted(entry.items(), key=lambda kv: -kv[1])))
    return SampleResult(token_ids, logprobs)


def sample_worst_case(logits: torch.Tensor) -> None:
    """Sample every row with the options that hold the most memory (top-p and min-p without
    top-k sort the vocabulary on a GPU, seeded rows draw noise for all of it, logprobs keep a
    log-softmax): the profiling step runs this on its logits, so the sampler's workspace counts
    in the KV pool's sizing."""
    params = SamplingParams(temperature=1.0, top_p=0.9, min_p=0.01, logprobs=20)
    seqs = [Sequence(-1 - row, "profile", 0, [0], params,
                     torch.Generator(device=logits.device).manual_seed(row), None,
                     RequestTimings())
            for row in range(logits.shape[0])]
    sample(logits, seqs)
