"""The benchmark workload: seeded random prompts and output lengths, identical for every engine.

Prompts are random token ids rather than text so that the prompt length is exact and no
tokenizer round trip can change it; special tokens are avoided so that no engine treats a
prompt token as BOS/EOS/padding.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int
    json_schema: dict[str, Any] | None = None  # a structured-output constraint, if any

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


def bench_schema(max_output_len: int) -> dict[str, Any]:
    """A JSON schema shaped like a typical API reply: a list of records (integer, bounded
    string, number, array of enums). It asks for more records than max_output_len tokens can
    hold, so a constrained request is masked at every token and, like a free one, ends at its
    output length: the two runs of a comparison take the same steps."""
    record = {"type": "object",
              "properties": {"id": {"type": "integer"},
                             "name": {"type": "string", "maxLength": 16},
                             "score": {"type": "number"},
                             "tags": {"type": "array", "items": {"enum": ["new", "sale", "gift"]},
                                      "maxItems": 3}},
              "required": ["id", "name", "score", "tags"], "additionalProperties": False}
    return {"type": "object",
            "properties": {"records": {"type": "array", "items": record,
                                       "minItems": max_output_len // 4 + 1}},
            "required": ["records"], "additionalProperties": False}


def with_json_schema(workload: list[BenchRequest], fraction: float) -> list[BenchRequest]:
    """The workload with bench_schema on `fraction` of the requests, spread evenly (0.5: every
    other request, starting with the second)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    schema = bench_schema(max(r.output_len for r in workload))
    return [dataclasses.replace(r, json_schema=schema)
            if int((i + 1) * fraction) > int(i * fraction) else r
            for i, r in enumerate(workload)]


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
