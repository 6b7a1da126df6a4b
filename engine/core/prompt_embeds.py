"""A prompt given as embeddings (vLLM's prompt_embeds, behind --enable-prompt-embeds): rows
that stand in for the token embeddings of a prompt nobody tokenized.

The sequence holds a placeholder token per row; every step that computes some of them
carries their rows (`StepInputs.embed_rows`) and the decoder writes them where those tokens'
embeddings would be, as transformers takes `inputs_embeds`. The rows stay with the request
for its whole life: a preempted request computes its prompt again from them.

The prefix cache keys each row by a digest of its values, so two prompts share cached blocks
only where their rows are equal from the first on."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.core.errors import RequestError

PLACEHOLDER = 0  # the token id each row's place holds (its embedding is overwritten)
FIELD = "prompt_embeds"


@dataclass(frozen=True)
class PromptEmbeds:
    """Rows [tokens, hidden] in the model's dtype, on the host, and each row's key in the
    prefix cache (a negative id, no token's)."""

    rows: torch.Tensor
    keys: tuple[int, ...]

    @classmethod
    def of(cls, value: Any, hidden_size: int, dtype: torch.dtype) -> PromptEmbeds:
        """The rows of a tensor [tokens, hidden] (or [1, tokens, hidden], as a model's
        embedding layer returns a batch of one); RequestError naming what is wrong with it."""
        if not isinstance(value, torch.Tensor):
            raise RequestError(f"must be a tensor [tokens, {hidden_size}], got "
                               f"{type(value).__name__}", param=FIELD)
        if value.layout != torch.strided:
            raise RequestError(f"must be a dense tensor, got layout {value.layout}", param=FIELD)
        if value.dim() == 3 and value.shape[0] == 1:
            value = value[0]
        if value.dim() != 2 or value.shape[1] != hidden_size or value.shape[0] == 0:
            raise RequestError(f"must have shape [tokens, {hidden_size}] (this model's hidden "
                               f"size) with at least one token, got {list(value.shape)}",
                               param=FIELD)
        if not value.is_floating_point():
            raise RequestError(f"must hold floating-point values, got {value.dtype}",
                               param=FIELD)
        rows = value.detach().to(device="cpu", dtype=dtype).contiguous()
        if not torch.isfinite(rows).all():
            raise RequestError("holds values that are not finite (or overflow the model's "
                               f"dtype, {dtype})", param=FIELD)
        return cls(rows, _row_keys(rows))

    def __len__(self) -> int:
        return self.rows.shape[0]

    @property
    def token_ids(self) -> list[int]:
        """The placeholder tokens its rows stand on, one each."""
        return [PLACEHOLDER] * len(self)

    def last(self, count: int) -> PromptEmbeds:
        """Its last `count` rows (vLLM's truncate_prompt_tokens)."""
        if count >= len(self):
            return self
        return PromptEmbeds(self.rows[-count:], self.keys[-count:])

    def rows_in_step(self, start: int, end: int, first_row: int) -> list[tuple[int, Any]]:
        """(step row, rows) for the prompt's positions [start, end) that are rows of these
        embeddings, the step's rows for them beginning at `first_row`."""
        stop = min(end, len(self))
        return [(first_row, self.rows[start:stop])] if start < stop else []


def _row_keys(rows: torch.Tensor) -> tuple[int, ...]:
    raw = rows.view(torch.uint8).numpy()  # each row's bytes
    return tuple(-1 - int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(),
                                     "big") // 2 for row in raw)
