"""Beam search over the engine's log-probabilities, with Hugging Face transformers' rules.

The engine itself decodes one token per sequence; beam search runs above it in rounds. Each
round asks for one token of every live beam with its top width + (end tokens) log-
probabilities: every continuation the round can keep is among them. Of the round's best
continuations, the best `width` that do not finish live on; those among the best `width`
that do finish (an end token, or max_tokens reached) become hypotheses, scored
by their summed log-probability over (generated length ** length_penalty), and the best
`width` hypotheses are kept. The search ends when every continuation finishes, or once the
hypotheses are `width` and no live beam can beat the worst of them: `early_stopping` False
(transformers' default) judges that by the live beam's score at its current length, True ends
as soon as the hypotheses are `width`, "never" bounds a live beam by the longest length it
could reach. That is `generate(num_beams=width, num_return_sequences=width,
do_sample=False)`, against which the tests check this token for token.

The prompt's KV cache is shared between rounds by the prefix cache: a round recomputes only
what each beam added since its blocks were last full.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.engine.core.outputs import CompletionOutput
from tokenmill.engine.core.sampling_params import SamplingParams, SamplingParamsError

EARLY_STOPPING = (False, True, "never")


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's BeamSearchParams, plus transformers' early_stopping and the end tokens.

    `temperature` is accepted as vLLM takes it and changes nothing: beams are ranked by the
    log-probabilities of the model's own logits, as transformers' (unsampled) beam search
    ranks them. `stop_token_ids` end a beam as the model's end-of-sequence tokens do (which
    `ignore_eos` leaves out); neither can end one before `min_tokens` tokens.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: bool | str = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise SamplingParamsError(f"n: beam search needs a beam width of at least 1, "
                                      f"got {self.beam_width}")
        if self.max_tokens < 1:
            raise SamplingParamsError(f"max_tokens: must be at least 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingParamsError(f"min_tokens: must be in [0, max_tokens] "
                                      f"([0, {self.max_tokens}]), got {self.min_tokens}")
        if self.early_stopping not in EARLY_STOPPING:
            raise SamplingParamsError(f"early_stopping: must be true, false or \"never\", "
                                      f"got {self.early_stopping!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))


@dataclass
class Beam:
    """A live beam or a finished hypothesis: its generated tokens, each token's top
    log-probabilities (the round's dict it was chosen from), their summed log-probability."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    cum_logprob: float = 0.0
    score: float = 0.0  # a hypothesis' length-penalized score
    finish_reason: str | None = None  # "stop" (an end token) or "length"
    stop_reason: int | None = None  # the stop_token_ids entry that ended it


class BeamSearch:
    """One prompt's search: `running` are the beams to extend next round (advance() takes
    each one's top log-probabilities, in that order); `done` once it has ended, `best()` its
    hypotheses, best first."""

    def __init__(self, params: BeamSearchParams, eos_token_ids: set[int]) -> None:
        self.params = params
        eos = set() if params.ignore_eos else set(eos_token_ids)
        self.stop_ids = set(params.stop_token_ids) - eos  # an EOS ends as EOS, no stop_reason
        self.finishing = self.stop_ids | eos
        self.width = params.beam_width
        # Each beam's top width + (end tokens) hold every continuation a round can keep: the
        # width best that do not end, and any end token above them. Across beams the round
        # ranks transformers' (1 + end tokens) x width best, which hold at least width that do
        # not end.
        self.num_candidates = self.width + len(self.finishing)
        self._ranked = max(2, 1 + len(self.finishing)) * self.width
        self.running: list[Beam] = [Beam()]
        self.hypotheses: list[Beam] = []
        self.done = False
        self._improvable = True

    def advance(self, top_logprobs: list[dict[int, float]]) -> None:
        """Extend the running beams by one token, given each one's top log-probabilities (at
        least num_candidates of them, most likely first, as the engine reports them)."""
        if len(top_logprobs) != len(self.running):
            raise ValueError(f"{len(top_logprobs)} log-probability sets for "
                             f"{len(self.running)} running beams")
        length = len(self.running[0].tokens) + 1  # every live beam has the same length
        early_end = length <= self.params.min_tokens
        candidates = heapq.nlargest(self._ranked, (
            (beam.cum_logprob + lp, -b, -rank, token)
            for b, (beam, entry) in enumerate(zip(self.running, top_logprobs, strict=True))
            for rank, (token, lp) in enumerate(entry.items())
            if not (early_end and token in self.finishing)))
        ends = [token in self.finishing or length >= self.params.max_tokens
                for _, _, _, token in candidates]
        if self._improvable and not (self.params.early_stopping is True and self._full):
            for (cum, b, _, token), end in zip(candidates[:self.width], ends, strict=False):
                if end:
                    self._keep(self._child(-b, token, cum, top_logprobs[-b], finished=True))
        self.running = [self._child(-b, token, cum, top_logprobs[-b])
                        for (cum, b, _, token), end in zip(candidates, ends, strict=True)
                        if not end][:self.width]
        self._improvable = self._improvable and self._can_improve(length)
        self.done = (not self.running or not self._improvable
                     or (self.params.early_stopping is True and self._full))

    def best(self) -> list[Beam]:
        """The hypotheses of a search that is done, best first (beam_width of them, unless
        the vocabulary offered fewer continuations)."""
        if not self.done:
            raise RuntimeError("the beam search has not ended")
        return list(self.hypotheses)

    @property
    def _full(self) -> bool:
        return len(self.hypotheses) >= self.width

    def _child(self, parent: int, token: int, cum_logprob: float, entry: dict[int, float],
               finished: bool = False) -> Beam:
        beam = self.running[parent]
        child = Beam(beam.tokens + [token], beam.logprobs + [entry], cum_logprob)
        if not finished:
            return child
        reason = "stop" if token in self.finishing else "length"
        child.stop_reason = token if token in self.stop_ids else None
        return self._scored(child, reason)

    def _scored(self, beam: Beam, reason: str) -> Beam:
        beam.finish_reason = reason
        beam.score = beam.cum_logprob / (len(beam.tokens) ** self.params.length_penalty)
        return beam

    def _keep(self, hypothesis: Beam) -> None:
        self.hypotheses.append(hypothesis)
        self.hypotheses.sort(key=lambda b: b.score, reverse=True)
        del self.hypotheses[self.width:]

    def _can_improve(self, length: int) -> bool:
        """Whether a live beam could still beat the worst hypothesis (transformers'
        heuristic: the best live beam's score at its length, or under "never" with a
        positive length penalty at the longest it may grow)."""
        if not self._full:
            return True
        if not self.running:
            return False
        penalty = self.params.length_penalty
        best_length = (self.params.max_tokens if self.params.early_stopping == "never"
                       and penalty > 0.0 else length)
        return self.running[0].cum_logprob / best_length ** penalty > self.hypotheses[-1].score


def round_params(search: BeamSearch, logprobs: int | None = None) -> SamplingParams:
    """The engine request of one beam for one round: one token, the top log-probabilities
    the search ranks (or the caller's `logprobs`, if more), nothing that would end it early
    or change its log-probabilities."""
    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                          logprobs=max(search.num_candidates, logprobs or 0))


@dataclass
class BeamSearchSequence:
    """One hypothesis as vLLM's LLM.beam_search returns it: `tokens` and `text` hold the prompt
    and the generated tokens; `logprobs` each generated token's top log-probabilities."""

    tokens: list[int]
    logprobs: list[dict[int, float]]
    cum_logprob: float
    text: str
    finish_reason: str | None = None
    stop_reason: int | None = None


@dataclass
class BeamSearchOutput:
    """A prompt's hypotheses, best first."""

    sequences: list[BeamSearchSequence]


def completion_outputs(search: BeamSearch, decode: Callable[[list[int]], str],
                       with_logprobs: bool) -> list[CompletionOutput]:
    """A finished search's hypotheses as a request's n completions, best first."""
    return [CompletionOutput(index=i, text=decode(beam.tokens), token_ids=beam.tokens,
                             finish_reason=beam.finish_reason, stop_reason=beam.stop_reason,
                             logprobs=beam.logprobs if with_logprobs else None)
            for i, beam in enumerate(search.best())]
