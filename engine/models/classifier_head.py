"""A classification head made of a causal LM's own head (vLLM's classifier_from_token): the
LM head's rows for the chosen tokens, so the classifier's logits are those tokens' logits;
for a two-way head (Qwen3-Reranker's no and yes) the second row less the first, whose sigmoid
is the second token's share of the two tokens' softmax."""

from __future__ import annotations

import torch

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.models.decoder import CausalLM


def token_head(model: CausalLM, token_ids: tuple[int, ...], two_way: bool, plan: ShardPlan,
               tp: TPGroup) -> torch.Tensor:
    """[labels, hidden] float32: the rows of the (vocabulary-parallel) LM head for
    `token_ids`, each read on the rank that holds it and summed over ranks."""
    head = model.lm_head.weight
    rows = torch.zeros(len(token_ids), head.shape[1], dtype=torch.float32, device=head.device)
    for row, token in enumerate(token_ids):
        local = token - plan.vocab_start
        if 0 <= local < plan.vocab_per_rank:
            rows[row] = head[local].float()
    tp.all_reduce(rows)
    return rows[1:] - rows[:1] if two_way else rows
