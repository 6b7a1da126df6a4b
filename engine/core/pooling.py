"""Embeddings (the pooling runner): a request's prompt runs through the model like any prompt,
chunked and batched with others; the step sums the hidden-state rows its pooling reads, and
once the whole prompt is computed those sums become the embedding. Nothing is sampled.

LAST reads the prompt's last token, CLS its first, MEAN all of them (summed per chunk here,
divided by the prompt length at the end). A prompt recomputed from its start (after a
preemption) starts its sums again.

A sequence classifier's sums come back through its head (one value per label); once pooled
they become the labels' probabilities (or stay logits, asked with use_activation false).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.engine.contract.pooling import Pooler
from tokenmill.engine.core.pooling_params import PoolingParams
from tokenmill.engine.core.request import Sequence


@dataclass
class SequencePooling:
    """One sequence's embedding: how it is pooled, and its sums so far."""

    pooler: Pooler
    params: PoolingParams
    sums: torch.Tensor | None = None


def pooled_rows(seq: Sequence, num_new: int) -> tuple[int, int] | None:
    """The rows [start, end) of the sequence's next chunk of num_new tokens (0: the chunk's
    first) that its pooling reads; None for a generation or a chunk it reads nothing of."""
    if seq.pooling is None:
        return None
    start, kind = seq.num_computed_tokens, seq.pooling.pooler.pooling_type
    if kind == "MEAN":
        return 0, num_new
    if kind == "CLS":
        return (0, 1) if start == 0 else None
    if start + num_new == seq.num_tokens:  # LAST
        return num_new - 1, num_new
    return None


def record(scheduled: list[tuple[Sequence, int]], pooled: torch.Tensor | None) -> None:
    """Fold the step's pooled rows (one per span, in the order pooled_rows gave them) into
    their sequences, before the step's tokens count as computed."""
    if pooled is None:  # no sequence of the step pools (every step of a generative model)
        return
    row = 0
    for seq, num_new in scheduled:
        if pooled_rows(seq, num_new) is not None:
            add_sums(seq.pooling, seq.num_computed_tokens, pooled[row])
            row += 1


def add_sums(pooling: SequencePooling, start: int, sums: torch.Tensor) -> None:
    """Fold one span's sums in: a chunk at the prompt's start begins them anew."""
    if start == 0 or pooling.sums is None:
        pooling.sums = sums.clone()
    else:
        pooling.sums += sums


def embedding(pooling: SequencePooling, prompt_len: int) -> list[float]:
    """The finished embedding: the mean for MEAN, the first `dimensions` values, scaled to
    unit length when normalizing. A classifier's: its labels' probabilities."""
    vector = pooling.sums.double()
    if pooling.pooler.pooling_type == "MEAN":
        vector = vector / prompt_len
    classifier = pooling.pooler.classifier
    if classifier is not None:
        if pooling.params.use_activation is False:
            return vector.float().tolist()
        probs = torch.sigmoid(vector) if classifier.sigmoid else torch.softmax(vector, dim=0)
        return probs.float().tolist()
    if pooling.params.dimensions is not None:
        vector = vector[:pooling.params.dimensions]
    normalize = pooling.params.normalize
    if normalize is None:
        normalize = pooling.pooler.normalize
    if normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    return vector.float().tolist()
