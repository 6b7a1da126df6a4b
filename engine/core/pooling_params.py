"""An embedding request's options; light (no torch), like SamplingParams."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.engine.core.errors import RequestError


@dataclass(frozen=True)
class PoolingParams:
    """A pooling request's options (vLLM's names). `dimensions` keeps the first N values
    (Matryoshka embeddings), before normalizing; `normalize` None is the model's setting."""

    dimensions: int | None = None
    normalize: bool | None = None
    # What the request asks of the model, by vLLM's names: embed (a vector), or classify (a
    # sequence classifier's probabilities, one per label).
    task: str = "embed"
    # A classifier's probabilities (None: yes), or its raw logits: a reward model's scores.
    use_activation: bool | None = None
    # Each prompt token's type (a pair's encoding by a BERT tokenizer: 0 for the first text,
    # 1 for the second), set by the score API for a cross-encoder that reads them; None: all 0.
    token_type_ids: tuple[int, ...] | None = None

    def check(self, hidden_size: int) -> None:
        if self.dimensions is not None and not 1 <= self.dimensions <= hidden_size:
            raise RequestError(f"dimensions must be in [1, {hidden_size}] (the model's "
                               f"embedding size), got {self.dimensions}", param="dimensions")
