"""What the engine returns for a request: texts, token ids, finish reasons, timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.engine.core.request import RequestTimings


@dataclass
class CompletionOutput:
    """One of a request's n generations, cumulative so far."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None      # "stop", "length" or "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
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
    # An embedding request's vector (the pooling runner), once finished.
    embedding: list[float] | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """An embedding request's result in vLLM's shape (LLM.embed): `outputs.embedding`."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True

    @classmethod
    def of(cls, out: RequestOutput) -> EmbeddingRequestOutput:
        return cls(out.request_id, out.prompt_token_ids, EmbeddingOutput(out.embedding or []),
                   out.finished)
