"""A sequence: one prompt plus the tokens generated for it, and where its KV cache lives."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenmill.engine.core.detokenizer import IncrementalDetokenizer
from tokenmill.engine.core.images import cache_token_ids
from tokenmill.engine.core.prompt_logprobs import new_prompt_logprobs
from tokenmill.engine.core.sampling_params import SamplingParams


def placeholder(row: int) -> int:
    """The token id a sequence holds, under async scheduling, for a token sampled on the device
    and not yet read back: -1 - row, its row in that step's sampled tokens (the next step's
    input ids read it there on the device: execution/step_buffers.py)."""
    return -1 - row


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestTimings:
    """Wall-clock instants (time.monotonic) of a request's life."""

    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    @property
    def prefill_time(self) -> float | None:
        """First scheduled to first token (vLLM's request prefill time)."""
        return _between(self.first_scheduled, self.first_token)

    @property
    def decode_time(self) -> float | None:
        """First token to the end."""
        return _between(self.first_token, self.finished)

    @property
    def inference_time(self) -> float | None:
        """First scheduled to the end."""
        return _between(self.first_scheduled, self.finished)


def _between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


class Sequence:
    """One generation stream. A request with n > 1 becomes n sequences sharing the prompt's KV.

    `num_computed_tokens` counts tokens whose KV is in the cache; the tokens after it are
    what the next step must feed the model (a prompt chunk, or the last sampled token).
    """

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        detokenizer: IncrementalDetokenizer,
        timings: RequestTimings,
        cache_salt: str | None = None,
        constraint: Any = None,
        lora: Any = None,
    ):
        self.seq_id = seq_id
        self.request_id = request_id
        self.index = index
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[dict[int, float]] = []
        # Output tokens and characters of visible text already reported (output_kind DELTA).
        self.sent_tokens = 0
        self.sent_text = 0
        self.prompt_logprobs = new_prompt_logprobs(params.prompt_logprobs)
        self.params = params
        self.generator = generator
        self.detokenizer = detokenizer
        self.timings = timings
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_preemptions = 0
        self.num_computed_when_preempted = 0  # the work a readmission may have to redo
        self.spec_tokens: list[int] = []  # proposed next tokens this step verifies
        self.cache_salt = cache_salt
        self.num_cached_blocks = 0  # leading blocks already indexed by the prefix cache
        # (key, node) of the last of them in the prefix cache (kv_cache/prefix_cache.py),
        # None while there is none.
        self.cached_prefix: tuple[int, int] | None = None
        self.num_cached_prompt_tokens = 0  # prompt tokens the prefix cache had at admission
        self.times_bypassed = 0     # admissions that went to a later arrival first
        self.priority = 0           # --scheduling-policy priority: lower runs first
        # This sequence's grammar matcher (structured/backend.py Matcher), None when free.
        self.constraint = constraint
        # Its LoRA adapter (lora_slots.LoRARef, None: the base model) and, while it runs,
        # the device slot holding it (-1 otherwise).
        self.lora = lora
        self.lora_slot = -1
        # Its recurrent-state slot while it holds one (a model with linear-attention layers,
        # kv_cache/state_slots.py), -1 otherwise.
        self.state_slot = -1
        # Where the prefix found cached for it at admission ended, in tokens: its recurrent
        # state is kept there (kv_cache/state_checkpoints.py).
        self.state_junction = 0
        # Token ids of params.bad_words (each spelling), set by the engine when it tokenizes.
        self.bad_word_ids: list[list[int]] = []
        # An embedding request's pooling.SequencePooling (how it pools, its sums so far); None
        # for generation. Its embedding, once the whole prompt is computed.
        self.pooling: Any = None
        self.embedding: list[float] | None = None
        # The prompt's images (images.ImageSpan), in order; shared by a request's sequences.
        self.images: list[Any] = []
        # A prompt given as embeddings (prompt_embeds.PromptEmbeds; its token ids are
        # placeholders), shared by a request's sequences; None for a prompt of tokens.
        self.prompt_embeds: Any = None

    def cache_token_ids(self) -> list[int]:
        """The ids the prefix cache keys this sequence by: its tokens, each image's
        placeholders replaced by that image's key (images.cache_token_ids), a prompt given
        as embeddings its rows' keys."""
        if self.prompt_embeds is not None:
            return list(self.prompt_embeds.keys) + self.output_token_ids
        return cache_token_ids(self.token_ids, self.images)

    @property
    def known_token_ids(self) -> list[int]:
        """The tokens it holds that are tokens: a prompt given as embeddings has none (its
        placeholders are nobody's), as transformers' generate from inputs_embeds has none."""
        return self.output_token_ids if self.prompt_embeds is not None else self.token_ids

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building the whole list (decode reads one token)."""
        prompt_len = len(self.prompt_token_ids)
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len:end - prompt_len]
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - prompt_len]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def awaits_token(self) -> bool:
        """Whether its last token is still on the device (async scheduling): a placeholder."""
        return bool(self.output_token_ids) and self.output_token_ids[-1] < 0

    @property
    def awaits_last_token(self) -> bool:
        """Whether the token still on the device is its last (max_tokens): it finishes when the
        token is read back whatever the token is, so no step needs to compute it."""
        return self.awaits_token and len(self.output_token_ids) >= self.params.max_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def text(self) -> str:
        return self.detokenizer.text

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, request={self.request_id!r}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens})")
