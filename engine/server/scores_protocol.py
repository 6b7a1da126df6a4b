"""The bodies of vLLM's /score and of the rerank API (Jina's and Cohere's shape, which vLLM
serves at /rerank, /v1/rerank and /v2/rerank)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from tokenmill.engine.core import score_pairs
from tokenmill.engine.server.embeddings_protocol import MAX_INPUTS, ActivationField
from tokenmill.engine.server.errors import FieldError
from tokenmill.engine.server.protocol import Priority, RequestModel, TruncatePromptTokens

Texts = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1,
                                                                   max_length=MAX_INPUTS)]


class ScoringFields(ActivationField):
    """What /score and rerank share; use_activation applies to a cross-encoder's scores."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    priority: Priority = 0
    user: str | None = None


class ScoreRequest(ScoringFields):
    """text_1 against text_2: one text against each of a list, or two lists pair by pair."""

    text_1: Annotated[str, Field(min_length=1)] | Texts
    text_2: Annotated[str, Field(min_length=1)] | Texts

    @model_validator(mode="after")
    def _pairs(self) -> ScoreRequest:
        first, second = self.text_1, self.text_2
        paired = isinstance(second, list) and len(second) == len(first)
        if isinstance(first, list) and len(first) > 1 and not paired:
            raise FieldError("text_2", f"text_1 holds {len(first)} texts, so text_2 must be a "
                             "list "
                             "of as many (or give text_1 one text to score against each of "
                             "text_2)")
        return self

    def pairs(self) -> list[tuple[str, str]]:
        return score_pairs(self.text_1, self.text_2)


class RerankDocument(RequestModel):
    model_config = ConfigDict(extra="ignore")

    text: Annotated[str, Field(min_length=1)]


class RerankRequest(ScoringFields):
    """`documents` as texts or {"text": ...} objects (Cohere's v1 form); `top_n` of them come
    back, best first (0 or unset: all)."""

    query: Annotated[str, Field(min_length=1)]
    documents: Annotated[list[Annotated[str, Field(min_length=1)] | RerankDocument],
                         Field(min_length=1, max_length=MAX_INPUTS)]
    top_n: Annotated[int, Field(ge=0)] | None = None
    return_documents: bool = True

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    @property
    def count(self) -> int:
        return len(self.documents) if not self.top_n else min(self.top_n, len(self.documents))

    def shown(self, index: int) -> dict[str, Any] | None:
        return {"text": self.texts()[index]} if self.return_documents else None
