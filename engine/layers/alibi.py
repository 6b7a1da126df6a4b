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


def mpt_alibi_slopes(num_heads: int, bias_max: float) -> torch.Tensor:
    """MPT's slopes: 2^(-bias_max * i / m) for i = 1..m, m the smallest power of two at least
    num_heads; for fewer heads than m, the odd terms then the even ones, the first num_heads
    of them (MosaicML's order, which transformers keeps)."""
    padded = 2 ** math.ceil(math.log2(num_heads))
    exponents = torch.arange(1, padded + 1, dtype=torch.int64).float() * (bias_max / padded)
    slopes = 1.0 / torch.pow(2, exponents)
    if padded != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes
