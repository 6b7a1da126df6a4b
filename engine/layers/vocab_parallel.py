"""Token embedding split over the vocabulary across tensor-parallel ranks.

Each rank holds `vocab_per_rank` rows; a token outside its rows embeds to zero there, and the
all-reduce sums the one rank's real row into every rank. On one rank it is nn.Embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan


class VocabParallelEmbedding(nn.Module):
    def __init__(self, plan: ShardPlan, hidden_size: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.start = plan.vocab_start
        self.rows = plan.vocab_per_rank
        self.weight = nn.Parameter(torch.empty(plan.vocab_per_rank, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)
