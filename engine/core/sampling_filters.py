"""Temperature, top-k, top-p and min-p: each sampled row's candidate tokens, without sorting the
vocabulary where a few candidates hold the row's kept set.

The filters apply in Hugging Face's order (its logits warpers; vLLM's top-k and top-p agree):
top-k keeps the k most likely tokens; top-p keeps the smallest set of those whose probability,
renormalized over the top-k set, reaches p; min-p drops a token less likely than min_p times
the most likely one (a ratio, so renormalizing does not change it). The most likely token is
always kept.

Every kept token of a row is among its most likely ones, so the filters need only the top K
logits (`torch.topk`), not the whole vocabulary sorted: K is the largest top_k asked. Rows with
top-p or min-p and no top-k do not say how many tokens they keep; on a CPU, where reading a
result costs nothing, K grows until every such row drops its last candidate; on a GPU, where it
would wait for the device, those steps sort the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.engine.core.sampling_params import SamplingParams
from tokenmill.engine.layers.to_device import list_to_device

FIRST_CANDIDATES = 64  # the CPU's first K for rows without top-k; it grows fourfold
# Devices whose results the host reads without waiting for queued work: there K may grow.
ADAPTIVE_DEVICES = ("cpu",)


@dataclass
class Candidates:
    """Each row's candidate tokens: `logits` [rows, K] over temperature, -inf where a filter
    drops the token, in descending order; `ids` [rows, K] their token ids (None: no row asked
    for a filter, and column j is token j of the whole vocabulary)."""

    logits: torch.Tensor
    ids: torch.Tensor | None

    def scattered(self, vocab: int) -> torch.Tensor:
        """[rows, vocab]: the candidates' logits at their token ids, -inf elsewhere."""
        if self.ids is None:
            return self.logits
        full = self.logits.new_full((self.logits.shape[0], vocab), float("-inf"))
        return full.scatter_(1, self.ids, self.logits)


def filters_any(params: SamplingParams) -> bool:
    """Whether a row asks for top-k, top-p or min-p."""
    return params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0


def candidates(logits: torch.Tensor, params: list[SamplingParams]) -> Candidates:
    """The rows' candidates under their SamplingParams (`params`, one per row)."""
    device, vocab = logits.device, logits.shape[1]
    settings = [(p.temperature, min(p.top_k, vocab) if p.top_k > 0 else vocab, p.top_p,
                 p.min_p) for p in params]
    table = list_to_device(settings, torch.float32, device)
    temperature, top_k, top_p, min_p = table.unbind(1)
    # A logit past float32's range (a strong repetition penalty, a low temperature) stays the
    # largest one: softmax of an infinite logit has no distribution.
    scaled = torch.nan_to_num(logits / temperature.unsqueeze(1), nan=float("-inf"),
                              posinf=torch.finfo(logits.dtype).max, neginf=float("-inf"))
    if not any(k < vocab or p < 1.0 or m > 0.0 for _, k, p, m in settings):
        return Candidates(scaled, None)
    adaptive = device.type in ADAPTIVE_DEVICES
    # Rows that keep an unknown number of tokens: top-p or min-p without top-k; a row with no
    # filter at all keeps the whole vocabulary.
    open_ended = [k == vocab and (p < 1.0 or m > 0.0) for _, k, p, m in settings]
    whole_vocab = any(k == vocab and p >= 1.0 and m <= 0.0 for _, k, p, m in settings)
    bounded_k = max((k for _, k, _, _ in settings if k < vocab), default=1)
    if whole_vocab or (any(open_ended) and not adaptive):
        size = vocab
    else:
        size = min(vocab, max(bounded_k, FIRST_CANDIDATES if any(open_ended) else 1))
    # A row without top-k measures top-p's mass over the whole vocabulary.
    whole = torch.logsumexp(scaled, dim=-1, keepdim=True) if any(open_ended) else None
    open_rows = list_to_device(open_ended, torch.bool, device) \
        if adaptive and any(open_ended) else None
    while True:
        # The whole vocabulary is sorted, not selected: topk of every element costs more.
        values, ids = (scaled.sort(dim=-1, descending=True) if size == vocab
                       else scaled.topk(size, dim=-1))
        keep = _kept(values, top_k, top_p, min_p, whole, vocab)
        if size == vocab or open_rows is None or not bool((keep[:, -1] & open_rows).any()):
            return Candidates(values.masked_fill(~keep, float("-inf")), ids)
        size = min(vocab, size * 4)


def _kept(values: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
          min_p: torch.Tensor, whole: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[rows, K] of the sorted candidates a row keeps. `whole`: each row's log-sum-exp over the
    vocabulary, top-p's normalizer for a row without top-k (None: every row has top-k, whose
    own set is its normalizer)."""
    rank = torch.arange(values.shape[1], device=values.device).unsqueeze(0)
    keep = rank < top_k.unsqueeze(1)
    top_k_set = values.masked_fill(~keep, float("-inf"))
    norm = torch.logsumexp(top_k_set, dim=-1, keepdim=True)
    if whole is not None:
        norm = torch.where((top_k < vocab).unsqueeze(1), norm, whole)
    probs = (top_k_set - norm).exp()
    mass_before = probs.cumsum(dim=-1) - probs
    keep &= mass_before < top_p.unsqueeze(1)
    keep &= probs >= min_p.unsqueeze(1) * probs[:, :1]
    keep[:, 0] = True
    return keep
