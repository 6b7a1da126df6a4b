"""What the engine returns for a request: texts, token ids, finish reasons, timings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from tokenmill.engine.core.request import RequestTimings


@dataclass
class CompletionOutput:
    """One of a request's n generations: all of it so far, or (RequestOutputKind.DELTA) what
    it added since the output before."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None      # "stop", "length" or "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        """vLLM's: the summed log-probability of the tokens, where logprobs were asked for
        (None otherwise); of a delta output, of its new tokens."""
        if self.logprobs is None:
            return None
        return sum(entry[token] for token, entry in zip(self.token_ids, self.logprobs,
                                                        strict=False))


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    # None for a prompt given as embeddings (vLLM's), which has no tokens.
    prompt_token_ids: list[int] | None
    outputs: list[CompletionOutput]
    finished: bool
    timings: RequestTimings = field(default_factory=RequestTimings)
    num_preemptions: int = 0
    # Prompt tokens found in the prefix cache at admission (device or host tier): not computed.
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs: per prompt token (None for the first) its logprob
    # and the top-k, most likely first, and the token's rank (1: the most likely).
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_logprob_ranks: list[int | None] | None = None
    # An embedding request's vector (the pooling runner), once finished; a classifier's
    # probabilities, one per label.
    embedding: list[float] | None = None
    # A prompt given as embeddings: its rows, each in a token's place.
    num_prompt_embeds: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        """The places the prompt took in the context: its tokens, or its embeddings' rows."""
        return self.num_prompt_embeds if self.prompt_token_ids is None else \
            len(self.prompt_token_ids)

    def extend(self, newer: RequestOutput) -> None:
        """Follow this delta output (RequestOutputKind.DELTA), or the outputs it has gathered,
        by the next delta, in place: each generation's text, tokens and logprobs joined, the
        rest as the newer says; the prompt's logprobs, which only a request's first delta
        carries, kept. What the newer output held is taken over, not copied, so each delta is
        joined once and a whole output built from deltas costs its length, not its square."""
        mine, then = self.outputs, newer.outputs
        if len(mine) == 1 == len(then) and mine[0].index == then[0].index:  # n = 1
            _extend(mine[0], then[0])
        else:
            by_index = {c.index: c for c in mine}
            for c in then:
                if c.index in by_index:
                    _extend(by_index[c.index], c)
                else:
                    mine.append(c)
            mine.sort(key=lambda c: c.index)
        # The request's id, prompt and prompt ids are the same in both.
        self.finished = newer.finished
        self.timings = newer.timings
        self.num_preemptions = newer.num_preemptions
        self.num_cached_tokens = newer.num_cached_tokens
        self.embedding = newer.embedding
        self.num_prompt_embeds = newer.num_prompt_embeds
        if newer.prompt_logprobs is not None:
            self.prompt_logprobs = newer.prompt_logprobs
            self.prompt_logprob_ranks = newer.prompt_logprob_ranks


def _extend(first: CompletionOutput, then: CompletionOutput) -> None:
    first.text += then.text
    first.token_ids.extend(then.token_ids)
    if then.logprobs is not None:
        if first.logprobs is None:
            first.logprobs = []
        first.logprobs.extend(then.logprobs)
    first.finish_reason, first.stop_reason = then.finish_reason, then.stop_reason


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingOutput:
    """Whatever the model pools for (LLM.encode): an embedding model's vector, a
    classifier's probabilities."""

    data: list[float]


@dataclass
class PoolingRequestOutput:
    """A pooling request's result in vLLM's shape: `outputs` holds what it asked for."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: Any
    finished: bool = True
    # How a finished request's values become `outputs` (LLM.encode's: as they are).
    _outputs_of: ClassVar[Callable[[list[float]], Any]] = PoolingOutput

    @classmethod
    def of(cls, out: RequestOutput) -> Self:
        return cls(out.request_id, out.prompt_token_ids, cls._outputs_of(out.embedding or []),
                   out.finished)


class EmbeddingRequestOutput(PoolingRequestOutput):
    """LLM.embed's: `outputs.embedding`."""

    _outputs_of = EmbeddingOutput


class ClassificationRequestOutput(PoolingRequestOutput):
    """LLM.classify's: `outputs.probs`, one per label."""

    _outputs_of = ClassificationOutput


class ScoringRequestOutput(PoolingRequestOutput):
    """LLM.score's, one per pair: `outputs.score`; `prompt_token_ids` are the pair's (a
    cross-encoder's) or both texts' (an embedding model's)."""

    _outputs_of = ScoringOutput
