"""The benchmark workload: seeded random prompts and output lengths, identical for every engine.

Prompts are random token ids rather than text so that the prompt length is exact and no
tokenizer round trip can change it; special tokens are avoided so that no engine treats a
prompt token as BOS/EOS/padding.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int

    @property
    def input_len(self) -> int:
        return len(self.prompt_token_ids)


def parse_range(text: str) -> tuple[int, int]:
    """'32:512' -> (32, 512), both inclusive; a single number 'N' means N:N."""
    low_text, sep, high_text = text.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise ValueError(f"expected a length range LOW:HIGH, got {text!r}") from None
    if not 1 <= low <= high:
        raise ValueError(f"length range {text!r} must satisfy 1 <= LOW <= HIGH")
    return low, high


def make_workload(num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                  seed: int, vocab_size: int,
                  special_token_ids: Iterable[int] = ()) -> list[BenchRequest]:
    """`num_prompts` requests with lengths uniform in the inclusive ranges, reproducible by seed."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_prompts}")
    special = set(special_token_ids)
    allowed = [t for t in range(vocab_size) if t not in special]
    if not allowed:
        raise ValueError("the vocabulary has no ordinary token to build prompts from")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        n_in = rng.randint(*input_len)
        n_out = rng.randint(*output_len)
        prompt = [allowed[rng.randrange(len(allowed))] for _ in range(n_in)]
        requests.append(BenchRequest(prompt, n_out))
    return requests
