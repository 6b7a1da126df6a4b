"""Request bodies of the OpenAI API (plus vLLM's sampling and tokenize extensions), validated
by pydantic.

Types are strict, as OpenAI's are: `"5"` or `true` is no integer, `"yes"` no boolean, `5` no
string; a float field takes a JSON integer (`"temperature": 1`) but no string, boolean, NaN or
infinity. Wrong types and out-of-range values fail validation and become HTTP 400 with an
OpenAI-style error naming the field.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from tokenmill.engine.contract.server_flags import RESERVED_TEMPLATE_KWARGS
from tokenmill.engine.core import SamplingParams
from tokenmill.engine.server.errors import FieldError
from tokenmill.engine.server.structured_fields import StructuredFields
from tokenmill.engine.server.tools import ToolCallMessage, template_tool_calls

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# vLLM's bound: a 64-bit signed integer. The engine seeds sequence i of a request with
# seed + 7919 * i, which stays within what torch's generators take.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# vLLM's: a request's rank under --scheduling-policy priority (lower runs first).
Priority = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


def _keeps_a_token(value: int) -> int:
    if value == 0:
        raise ValueError("must be at least 1 (or -1: the context length)")
    return value


# vLLM's truncate_prompt_tokens: keep a prompt's last K tokens (-1: the context length).
TruncatePromptTokens = Annotated[int, Field(ge=-1), AfterValidator(_keeps_a_token)]


class RequestModel(BaseModel):
    """Every request body and its parts: strict types (see the module docstring). A null is
    the field's default where the field takes no null, as OpenAI reads its nullable fields:
    the openai client sends `n=None` as `"n": null`."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        defaulted = _defaulted_on_null(cls)
        return {k: v for k, v in data.items() if v is not None or k not in defaulted}


@functools.cache
def _defaulted_on_null(model: type[BaseModel]) -> frozenset[str]:
    """The names (and aliases) of a model's fields that have a default and take no null."""
    names = set()
    for name, info in model.model_fields.items():
        if not info.is_required() and not _takes_null(info.annotation):
            names.update(n for n in (name, info.alias) if n)
    return frozenset(names)


def _takes_null(annotation: Any) -> bool:
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    if typing.get_origin(annotation) is Annotated:
        return _takes_null(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_null(arg) for arg in typing.get_args(annotation))
    return False


class StreamOptions(RequestModel):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk also carries the usage so far.
    continuous_usage_stats: bool = False


class SamplingFields(RequestModel, StructuredFields):
    """Fields shared by completions and chat completions (structured outputs and logit_bias:
    structured_fields.py)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1  # OpenAI's bound
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    include_stop_str_in_output: bool = False
    allowed_token_ids: Annotated[list[int], Field(min_length=1)] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    # vLLM's: logprobs name tokens "token_id:ID" (default: the server's flag).
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt's and each choice's token ids in the reply (RL frameworks train on
    # exactly the ids sampled, not a re-tokenized text).
    return_token_ids: bool | None = None
    # vLLM's: keep the prompt's last K tokens (-1: the context length).
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    priority: Priority = 0
    # vLLM's: n hypotheses of a beam search of width n, in place of sampling
    # (server/beam_requests.py); early_stopping is transformers' (true, false or "never").
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False

    # vLLM's fields whose work this server does not do: refused by name, not ignored.
    logits_processors: Any = None
    guided_whitespace_pattern: Any = None

    @model_validator(mode="after")
    def _check_top_k(self) -> SamplingFields:
        if self.top_k is not None and self.top_k != -1 and self.top_k < 1:
            raise FieldError("top_k", "must be -1 (disabled) or at least 1")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise FieldError("stop", "at most 16 stop sequences")
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "only allowed when stream is true")
        for name, why in (("logits_processors", "this server runs no request's own code"),
                          ("guided_whitespace_pattern", "JSON is generated with the "
                                                        "grammar's own whitespace")):
            if getattr(self, name) is not None:
                raise FieldError(name, f"not supported: {why}")
        return self

    def sampling_params(self, max_tokens: int, logprobs: int | None,
                        defaults: dict[str, float] | None = None) -> SamplingParams:
        """The engine's parameters; a sampling setting the request leaves out takes its value
        from `defaults` (the model's generation config), else the API's default."""
        defaults = defaults or {}

        def pick(name: str, api_default: float) -> Any:
            value = getattr(self, name)
            return value if value is not None else defaults.get(name, api_default)

        return SamplingParams(
            n=self.n,
            max_tokens=max_tokens,
            temperature=pick("temperature", 1.0),
            top_p=pick("top_p", 1.0),
            top_k=pick("top_k", -1),
            min_p=pick("min_p", 0.0),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=pick("repetition_penalty", 1.0),
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            logit_bias=self.logit_bias,
            structured_outputs=self.constraint(),
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(SamplingFields):
    # Absent, "" or [] beside prompt_embeds: that request's prompts are its embeddings only.
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    # 0 only with echo: the prompt alone comes back, its tokens scored where logprobs are asked
    # (OpenAI's legacy completions and vLLM answer it; evaluation harnesses score prompts so).
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    logprobs: Annotated[int, Field(ge=0)] | None = None
    echo: bool = False
    # vLLM's: the tokenizer's special tokens (a BOS) added to a text prompt.
    add_special_tokens: bool = True
    # vLLM's extension. Counts up to --max-logprobs (checked by the engine).
    prompt_logprobs: Annotated[int, Field(ge=0)] | None = None
    best_of: int | None = None
    suffix: str | None = None
    # vLLM's (--enable-prompt-embeds): prompts given as embeddings, each a base64 string of
    # a tensor [tokens, hidden size] saved by torch.save; they come before `prompt`'s, as
    # vLLM orders them.
    prompt_embeds: str | list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise FieldError("best_of", "only best_of equal to n is supported")
        if self.suffix:
            raise FieldError("suffix", "not supported")
        if self.prompt_embeds is not None:
            if not self.prompt_embeds:
                raise FieldError("prompt_embeds", "must not be empty")
            if self.echo:
                raise FieldError("echo", "a prompt given as embeddings has no text to echo")
        elif self.prompt is None:
            raise FieldError("prompt", "Field required")
        elif isinstance(self.prompt, list) and not self.prompt:
            raise FieldError("prompt", "must not be empty")
        if self.max_tokens == 0 and not self.echo:
            raise FieldError("max_tokens", "must be at least 1; 0 is allowed only with echo, "
                                           "which returns the prompt alone")
        return self

    @property
    def prompt_only(self) -> bool:
        """echo with max_tokens 0: the engine runs the prompt (scoring it) and its one token
        is not shown."""
        return self.echo and self.max_tokens == 0

    def sampling_params(self, max_tokens: int, logprobs: int | None,
                        defaults: dict[str, float] | None = None) -> SamplingParams:
        """With echo and logprobs the echoed prompt's tokens get logprobs too (as OpenAI's
        legacy completions and vLLM give them): the engine scores the prompt."""
        params = super().sampling_params(max_tokens, logprobs, defaults)
        asked = [k for k in (self.prompt_logprobs, logprobs if self.echo else None)
                 if k is not None]
        return replace(params, prompt_logprobs=max(asked)) if asked else params

    def prompts(self) -> list[str | list[int]]:
        """The prompts given as text or token ids (none where `prompt` is absent, "" or []
        beside prompt_embeds)."""
        p = self.prompt
        if self.prompt_embeds is not None and not p:
            return []
        if isinstance(p, str):
            return [p]
        if all(isinstance(t, int) for t in p):
            return [list(p)]
        return list(p)


class ImageURL(RequestModel):
    model_config = ConfigDict(extra="allow")

    url: str
    detail: str | None = None  # OpenAI's resolution hint; the model's processor decides


class ContentPart(RequestModel):
    """One part of a message's content list: text, or an image (OpenAI's image_url part: an
    http(s) or data: URL) for a model that reads images, or an assistant's refusal (read as
    its text, as vLLM does). Other kinds (input_audio, video_url, file) are a 400 naming their
    type."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None
    refusal: str | None = None

    @property
    def url(self) -> str:
        """An image part's URL (the object's, or vLLM's bare string)."""
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


class ChatMessage(RequestModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallMessage] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None

    def template_message(self) -> dict[str, Any]:
        """This message as the chat template sees it (tool calls and results included)."""
        # Parts stay parts (an image as {"type": "image"}, as processors' templates read it):
        # content_format.py gives the template the form it reads.
        content: str | list[dict[str, str]] = (
            [{"type": "image"} if part.type == "image_url" else
             {"type": "text", "text": (part.refusal if part.type == "refusal" else part.text)
              or ""} for part in self.content]
            if isinstance(self.content, list) else self.content or "")
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": content}
        if self.tool_calls:
            message["tool_calls"] = template_tool_calls(self.tool_calls)
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        thought = self.reasoning()
        if self.role == "assistant" and thought is not None:
            # Qwen3's template shows earlier thinking as reasoning_content, GPT-OSS's (the
            # analysis channel of a turn that called a tool) as thinking.
            message["reasoning_content"] = message["thinking"] = thought
        return message

    def reasoning(self) -> str | None:
        """An earlier assistant turn's thinking, sent back as vLLM returned it (`reasoning`,
        or the older `reasoning_content`)."""
        extra = self.model_extra or {}
        thought = extra.get("reasoning", extra.get("reasoning_content"))
        return thought if isinstance(thought, str) else None

    def image_urls(self) -> list[str]:
        """The URLs of this message's images, in order."""
        parts = self.content if isinstance(self.content, list) else []
        return [part.url for part in parts if part.type == "image_url"]

    @field_validator("content")
    @classmethod
    def _text_and_image_parts(cls, content: str | list[ContentPart] | None):
        for part in content if isinstance(content, list) else ():
            if part.type == "image_url":
                if part.image_url is None:
                    raise ValueError("a content part of type 'image_url' needs an image_url "
                                     "field with a url")
                continue
            if part.type not in ("text", "refusal"):
                raise ValueError(f"content part type {part.type!r} is not supported: this "
                                 "server reads text, refusal and image_url parts")
            if getattr(part, part.type) is None:
                raise ValueError(f"a content part of type {part.type!r} needs a {part.type} "
                                 "field")
        return content


class ChatTemplateFields(RequestModel):
    """vLLM's chat-template fields of a request with `messages`: whether the template opens
    the assistant's turn, or continues the last (assistant) message instead; extra
    variables for the template (Qwen3's `enable_thinking`, say); settings of the image
    processor for this request's images (Qwen-VL's `max_pixels`, say); the request's own
    template and a retrieval template's documents."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    # vLLM's: the request's own template (server/request_template.py), and documents for a
    # retrieval template (the template's `documents`, as transformers passes them).
    chat_template: Annotated[str, Field(min_length=1)] | None = None
    documents: list[dict[str, Any]] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(set(value or {}) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(f"{reserved[0]!r} is not a template variable the request may set "
                             "(use the request field of that name where there is one)")
        return value

    @model_validator(mode="after")
    def _one_ending(self) -> ChatTemplateFields:
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError("continue_final_message", "can't be true with "
                             "add_generation_prompt (set it to false)")
        return self


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tools: list[Any] | None = None  # checked by tools.plan_tools, which names the bad field
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's; the chat template's `reasoning_effort` (GPT-OSS's template writes it into
    # its system message), unless chat_template_kwargs sets that variable itself.
    reasoning_effort: str | None = None
    # vLLM's: false leaves the thinking a --reasoning-parser splits off out of the reply.
    include_reasoning: bool = True
    # vLLM's: the rendered prompt's scores, top-level in the reply (not when streamed).
    prompt_logprobs: Annotated[int, Field(ge=0)] | None = None
    # vLLM's: the reply's content starts with the last message's, where that message has the
    # reply's role (a continued assistant message comes back whole).
    echo: bool = False
    # OpenAI's outputs other than text, and its hosted web search: refused by name.
    modalities: list[str] | None = None
    audio: Any = None
    web_search_options: Any = None
    # OpenAI's deprecated forms of tools and tool_choice: refused, naming their successors.
    functions: Any = None
    function_call: Any = None
    # vLLM's: special tokens added on top of the rendered template (which writes its own).
    add_special_tokens: bool = False

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "requires logprobs to be true")
        if self.prompt_logprobs is not None and self.stream:
            raise FieldError("prompt_logprobs", "not available when stream is true")
        if set(self.modalities or ["text"]) != {"text"}:
            raise FieldError("modalities", "this server writes text only")
        if self.audio is not None:
            raise FieldError("audio", "this server writes text only")
        for old, new in (("functions", "tools"), ("function_call", "tool_choice")):
            if getattr(self, old) is not None:
                raise FieldError(old, f"OpenAI's deprecated form of {new}: send {new}")
        if self.web_search_options is not None:
            raise FieldError("web_search_options", "this server searches nothing: the model "
                                                   "answers from the messages alone")
        return self

    def sampling_params(self, max_tokens: int, logprobs: int | None,
                        defaults: dict[str, float] | None = None) -> SamplingParams:
        params = super().sampling_params(max_tokens, logprobs, defaults)
        if self.prompt_logprobs is None:
            return params
        return replace(params, prompt_logprobs=self.prompt_logprobs)

    def conversation(self) -> list[dict[str, Any]]:
        return [m.template_message() for m in self.messages]

    def echoed(self, role: str) -> str:
        """What echo puts before the reply: the last message's text, where it is `role`'s."""
        last = self.messages[-1]
        if not self.echo or last.role != role:
            return ""
        if isinstance(last.content, list):
            return "".join(part.text or "" for part in last.content if part.type == "text")
        return last.content or ""

    def template_variables(self) -> dict[str, Any] | None:
        """The template's extra variables: chat_template_kwargs over reasoning_effort."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    def image_urls(self) -> list[str]:
        """Every message's images, in the order the prompt holds them."""
        return [url for message in self.messages for url in message.image_urls()]


class TokenizeRequest(ChatTemplateFields):
    """vLLM's /tokenize: a `prompt`, or chat `messages` rendered by the chat template."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    # None: vLLM's defaults, true for a prompt (BOS and the like), false for messages (the
    # chat template writes its own).
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    # vLLM's: the tools a chat request would render, so the count is its prompt_tokens.
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise FieldError("prompt", "give either prompt or messages")
        return self

    def conversation(self) -> list[dict[str, Any]]:
        return [m.template_message() for m in self.messages or []]


class DetokenizeRequest(RequestModel):
    """vLLM's /detokenize: token ids back to text."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]
