"""Prompt-token scores on the device: each row's hidden state scores the prompt token after it
(its logprob and rank, and the top-k), for the requests that ask for prompt logprobs.

Rows are projected to the vocabulary ROWS_PER_SLICE at a time and reduced on the device to
what is returned, so a long prompt never holds [prompt, vocab] logits at once. Every
tensor-parallel rank runs the same slices: the LM head gathers its vocabulary shards with a
collective.
"""

from __future__ import annotations

import torch

from tokenmill.engine.execution.step_inputs import PromptRows
from tokenmill.engine.layers.to_device import list_to_device
from tokenmill.engine.models.decoder import CausalLM

ROWS_PER_SLICE = 256  # [256, vocab] float32 logits at a time: 128 MiB at a 128k vocabulary


def score_rows(model: CausalLM, hidden: torch.Tensor, rows: PromptRows) -> torch.Tensor:
    """[len(rows), 2 + 2 * top_k] float64 on the device: each row's target logprob, its rank,
    then the top-k logprobs and their token ids (exact in float64)."""
    index = list_to_device(rows.rows, torch.long, hidden.device)
    targets = list_to_device(rows.targets, torch.long, hidden.device).unsqueeze(1)
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
