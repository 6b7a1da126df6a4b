"""Per-request generation options, validated at construction (OpenAI / vLLM names)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tokenmill.engine.core.prompt_truncation import KEEP_RULE, valid_keep
from tokenmill.engine.core.structured.params import StructuredOutputsError, StructuredOutputsParams

LOGIT_BIAS_LIMIT = 100.0
# vLLM's floor: a positive temperature below it is raised to it. Dividing logits by less
# overflows float32, and a row with an infinite logit has no distribution to draw from.
MIN_TEMPERATURE = 1e-2
_INT_OPTIONS = ("n", "max_tokens", "min_tokens", "top_k")
_OPTIONAL_INT_OPTIONS = ("logprobs", "prompt_logprobs", "seed", "truncate_prompt_tokens")
_FLOAT_OPTIONS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty")


class RequestOutputKind(enum.IntEnum):
    """What each of a request's outputs holds (vLLM's): everything so far, only what is new
    since the output before, or nothing until the one that finishes it."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParamsError(ValueError):
    """An invalid sampling option; the message names the option."""


@dataclass
class SamplingParams:
    """How to generate for one prompt.

    temperature 0 means greedy; a positive temperature below 0.01 is taken as 0.01 (as vLLM
    does). `logprobs=k` returns the top-k log-probabilities of every
    generated token (plus the sampled one); `prompt_logprobs=k` the same for every prompt token
    after the first (engine/core/prompt_logprobs.py). `seed` makes a sampled request reproducible
    whatever else shares its batch.

    `logit_bias` (OpenAI's) maps token ids to a bias in [-100, 100] added to that token's logit
    before sampling; ids are checked against the model's vocabulary when the request is added.

    `structured_outputs` constrains the output (a StructuredOutputsParams, or a dict of its
    fields): a JSON schema, any JSON object, a regex, a choice of strings, an EBNF grammar or
    a structural tag.
    The constrained request runs in the same batch as free ones; its tokens are masked to what
    the grammar allows, and it ends when the grammar does (EOS is allowed only then). A caller
    that must force a shape, e.g. tool calling's `tool_choice: required` or a named function,
    sets a JSON schema:

        params = dataclasses.replace(params, structured_outputs=StructuredOutputsParams(
            json={"type": "object", "properties": {"name": {"const": "get_weather"},
                                                   "arguments": parameters_schema},
                  "required": ["name", "arguments"], "additionalProperties": False}))

    A schema feature the grammar can't enforce raises SamplingParamsError naming it; a
    constraint that does not compile raises RequestError when the request is added.

    vLLM's `min_tokens`: until that many tokens are out, EOS and `stop_token_ids` are masked
    and stop strings are not looked for. `include_stop_str_in_output` keeps the stop string
    that ended the text at its end. `allowed_token_ids` restricts every sampled token to those
    ids (where a grammar allows none of them at a step, the grammar wins); `bad_words` are
    never generated: each word, with and without a leading space, is tokenized, and the last
    token of one is masked wherever the output ends with the ones before it (always, for a
    one-token word).

    vLLM's `output_kind`: each step's output holds the whole generation so far (CUMULATIVE),
    only its new tokens, text and logprobs (DELTA: the prompt's logprobs come in the first),
    or the engine reports the request only once it finishes (FINAL_ONLY, which LLM.generate
    uses: no output is built for steps nobody reads).

    vLLM's offline options: `detokenize=False` leaves the outputs' text empty (token ids and
    logprobs only, no stop strings), which saves the detokenizer's host time;
    `truncate_prompt_tokens` runs the prompt's last k tokens (-1: the context length), within
    the special tokens the tokenizer puts around a text, as the server's field does;
    `spaces_between_special_tokens` is taken with either value: Hugging Face's fast
    tokenizers, which the engine decodes with, put no space between special tokens either
    way; `guided_decoding` is vLLM's older name of `structured_outputs`.
    """

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    detokenize: bool = True
    truncate_prompt_tokens: int | None = None
    spaces_between_special_tokens: bool = True
    guided_decoding: StructuredOutputsParams | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._check_types()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        _require(all(isinstance(s, str) for s in self.stop), "stop", "must be strings")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _id_list(self.allowed_token_ids, "allowed_token_ids")
        if self.bad_words is not None:
            _require(not isinstance(self.bad_words, str | bytes | dict), "bad_words",
                     "must be a list of non-blank strings")
            self.bad_words = list(self.bad_words)
        _require(self.n >= 1, "n", f"must be at least 1, got {self.n}")
        _require(self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}")
        _require(0 <= self.min_tokens <= self.max_tokens, "min_tokens",
                 f"must be in [0, max_tokens] ([0, {self.max_tokens}]), got {self.min_tokens}")
        _require(all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                     for t in self.stop_token_ids),
                 "stop_token_ids", "must be a list of token ids (integers, at least 0)")
        _require(self.allowed_token_ids is None
                 or (len(self.allowed_token_ids) > 0
                     and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                             for t in self.allowed_token_ids)),
                 "allowed_token_ids", "must be a non-empty list of token ids")
        _require(self.bad_words is None
                 or all(isinstance(w, str) and w.strip() for w in self.bad_words),
                 "bad_words", "must be a list of non-blank strings")
        _require(self.temperature >= 0.0, "temperature",
                 f"must be non-negative, got {self.temperature}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        _require(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _require(self.top_k == -1 or self.top_k >= 1, "top_k",
                 f"must be -1 (disabled) or at least 1, got {self.top_k}")
        _require(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _require(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
                 f"must be in [-2, 2], got {self.presence_penalty}")
        _require(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
                 f"must be in [-2, 2], got {self.frequency_penalty}")
        _require(self.repetition_penalty > 0.0, "repetition_penalty",
                 f"must be positive, got {self.repetition_penalty}")
        _require(all(s for s in self.stop), "stop", "stop strings must not be empty")
        # The most a request may ask for is the engine's (--max-logprobs).
        _require(self.logprobs is None or self.logprobs >= 0, "logprobs",
                 f"must be at least 0, got {self.logprobs}")
        _require(self.prompt_logprobs is None or self.prompt_logprobs >= 0,
                 "prompt_logprobs", f"must be at least 0, got {self.prompt_logprobs}")
        # A 64-bit signed integer (vLLM's bound): sequence i is seeded with seed + 7919 * i,
        # which must stay within what a torch generator takes (-2**63 .. 2**64 - 1).
        _require(self.seed is None or -(2**63) <= self.seed < 2**63, "seed",
                 f"must be a 64-bit signed integer, got {self.seed}")
        self.logit_bias = _logit_bias(self.logit_bias) or None
        _require(self.detokenize or not self.stop, "stop",
                 "stop strings are looked for in the text: they need detokenize=True")
        _require(valid_keep(self.truncate_prompt_tokens), "truncate_prompt_tokens",
                 f"{KEEP_RULE}, got {self.truncate_prompt_tokens}")
        if self.guided_decoding is not None:
            _require(self.structured_outputs is None, "guided_decoding",
                     "give structured_outputs or its older name guided_decoding, not both")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as exc:
                raise SamplingParamsError(f"structured_outputs: {exc}") from None
            except StructuredOutputsError as exc:
                raise SamplingParamsError(f"structured_outputs: {exc}") from None
        _require(self.structured_outputs is None
                 or isinstance(self.structured_outputs, StructuredOutputsParams),
                 "structured_outputs", "must be a StructuredOutputsParams or a dict of its fields")
        try:
            self.output_kind = RequestOutputKind(self.output_kind)
        except ValueError:
            raise SamplingParamsError(f"output_kind: {self.output_kind!r} is not one of "
                                      f"{[k.name for k in RequestOutputKind]}") from None

    def _check_types(self) -> None:
        """Integers where counts and ids go (a float n or logprobs failed inside a step), real
        numbers where settings go; bools are neither."""
        for name in _INT_OPTIONS + _OPTIONAL_INT_OPTIONS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INT_OPTIONS:
                continue
            _require(isinstance(value, int) and not isinstance(value, bool), name,
                     f"must be an integer, got {value!r}")
        for name in _FLOAT_OPTIONS:
            value = getattr(self, name)
            _require(isinstance(value, int | float) and not isinstance(value, bool), name,
                     f"must be a number, got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


def _logit_bias(bias: Any) -> dict[int, float]:
    """{token id: bias}; ids may come as strings (JSON object keys)."""
    if bias is None:
        return {}
    _require(isinstance(bias, dict), "logit_bias", "must map token ids to biases")
    out: dict[int, float] = {}
    for key, value in bias.items():
        # A JSON key is a string: plain ASCII digits only, so "05", "+5" or " 5" are not
        # taken for token 5 (where a second key for 5 would silently replace the first).
        plain = isinstance(key, str) and key.isascii() and key.lstrip("-").isdigit() \
            and str(int(key)) == key
        if isinstance(key, bool) or not (isinstance(key, int) or plain):
            raise SamplingParamsError(f"logit_bias: token id {key!r} is not an integer")
        token = int(key)
        _require(token >= 0, "logit_bias", f"token id {key!r} is not a valid token id")
        _require(token not in out, "logit_bias", f"token id {token} is given twice")
        _require(isinstance(value, int | float) and not isinstance(value, bool)
                 and -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT, "logit_bias",
                 f"the bias of token {token} must be a number in [-100, 100], got {value!r}")
        out[token] = float(value)
    return out


def _id_list(ids: Any, option: str) -> list[int]:
    _require(isinstance(ids, list | tuple), option, "must be a list of token ids")
    return list(ids)


def _require(ok: bool, option: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(f"{option}: {message}")
