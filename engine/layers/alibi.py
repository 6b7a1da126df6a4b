"""ALiBi (attention with linear biases): no positional encoding of q or k; each head instead
takes its slope times a key's distance behind the query off that key's score (BLOOM)."""

from __future__ import annotations

import math

import torch


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Each head's slope, as the ALiBi paper and transformers' BLOOM give them: a geometric
    series 2^(-8/n), 2^(-16/n), ... over the largest power of two n of heads at most
    num_heads, then every other term of the series for 2n, for the heads past n."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = torch.pow(torch.tensor(base), torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, num_heads - closest)
        extra = torch.pow(torch.tensor(extra_base),
                          torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32))
        slopes = torch.cat([slopes, extra])
    return slopes.float()
