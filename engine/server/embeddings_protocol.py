"""The /v1/embeddings body: OpenAI's (`input`: a text, texts, token ids or lists of them),
or vLLM's chat form (`messages`, rendered by the chat template), plus vLLM's extras; and
vLLM's /classify body, which takes the same inputs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from tokenmill.engine.server.errors import FieldError
from tokenmill.engine.server.protocol import (
    ChatMessage,
    ChatTemplateFields,
    Priority,
    RequestModel,
    TruncatePromptTokens,
)

# OpenAI's limit on the inputs of one request.
MAX_INPUTS = 2048


class PoolingInputs(ChatTemplateFields):
    """What the pooling routes (embeddings, classify) take in: `input` (a text, texts, token
    ids or lists of them) or a conversation (`messages`)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    user: str | None = None
    # vLLM's: keep a prompt's last K tokens (-1: the model's context length); special tokens
    # (None: added to `input`, not to `messages`, whose template writes its own).
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    priority: Priority = 0
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = False  # vLLM's default for pooling a conversation

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: Any) -> Any:
        if value in ("", []):
            raise ValueError("must not be empty")
        if isinstance(value, list) and not isinstance(value[0], int):
            if len(value) > MAX_INPUTS:
                raise ValueError(f"holds {len(value)} items; at most {MAX_INPUTS}")
            if any(item in ("", []) for item in value):
                raise ValueError("must not hold an empty text or token list")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> PoolingInputs:
        if (self.input is None) == (self.messages is None):
            raise FieldError("input", "give either input or messages")
        return self

    def inputs(self) -> list[str | list[int]]:
        """Each text or token list to embed, in order (not for `messages`)."""
        items: Any = self.input
        if isinstance(items, str):
            return [items]
        if all(isinstance(t, int) for t in items):
            return [list(items)]
        return list(items)

    def conversation(self) -> list[dict[str, Any]]:
        return [m.template_message() for m in self.messages or []]


class EmbeddingRequest(PoolingInputs):
    """`dimensions` keeps the first N values; `normalize` (vLLM's) scales the vector to unit
    length (None: the model's setting)."""

    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    normalize: bool | None = None
    # vLLM's: a base64 vector's element type and byte order (native: the server's).
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"


class ActivationField(RequestModel):
    """vLLM's use_activation (formerly activation): false returns a classifier's logits
    instead of its probabilities (a reward model's raw scores)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    use_activation: bool | None = Field(None, validation_alias=AliasChoices("use_activation",
                                                                            "activation"))


class PoolingRequest(PoolingInputs, ActivationField):
    """vLLM's /pooling body: each input's pooled output, whatever the model pools for (an
    embedding model's vector, a classifier's probabilities); `dimensions` and `normalize` as
    in /v1/embeddings, use_activation as in /classify."""

    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    normalize: bool | None = None
    # vLLM's: a base64 vector's element type and byte order (native: the server's).
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    # vLLM's: what to pool for; per-token tasks (token_embed, token_classify) are not served.
    task: Literal["embed", "classify"] | None = None


class ClassificationRequest(PoolingInputs, ActivationField):
    """vLLM's /classify body: each input's probabilities over the classifier's labels."""
