"""The request body of OpenAI's Responses API (POST /v1/responses), and its translation into a
chat completion request: `input` items become chat messages (a function call joins the
assistant turn before it, a function call's output becomes a tool message), `instructions` a
system message first, `text.format` the response_format, Responses-style function tools the
chat shape. The vLLM sampling extensions of chat completions (top_k, min_p, seed, stop, ...)
are taken as they are.

A follow-up (`previous_response_id`) is the stored conversation's items with this `input`
after them; the route looks the conversation up, and the items that item references name
(responses_store.py). Stored conversations and stored prompts are refused: the client sends
the items themselves.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenmill.engine.server.errors import FieldError
from tokenmill.engine.server.protocol import (
    ChatCompletionRequest,
    ChatTemplateFields,
    RequestModel,
    SamplingFields,
)
from tokenmill.engine.server.responses_items import new_item_id

# The `include` entry that asks for the output text's logprobs.
OUTPUT_LOGPROBS = "message.output_text.logprobs"

# The id prefix of an input item the client sent without one, by its type.
_ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                   "reasoning": "rs"}

# Content part types that carry text; besides them input_image is read (an image URL), the
# others (files, audio) are refused.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text",
               "refusal": "refusal", "reasoning_text": "text", "summary_text": "text"}


class RequestFormatError(ValueError):
    """A field of the Responses request that can't be served; `param` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class TextFormat(RequestModel):
    """`text.format`: plain text, any JSON object, or JSON following a schema."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or self.name is None):
            raise FieldError("text", "format of type 'json_schema' needs name and schema")
        return self

    def response_format(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        schema = {"name": self.name, "schema": self.schema_}
        if self.strict is not None:
            schema["strict"] = self.strict
        return {"type": "json_schema", "json_schema": schema}


class TextConfig(RequestModel):
    model_config = ConfigDict(extra="ignore")  # verbosity: a hint this server doesn't take

    format: TextFormat | None = None


class ResponsesRequest(SamplingFields, ChatTemplateFields):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    # Extra output asked for; of what OpenAI lists, the output text's logprobs are served.
    include: list[str] | None = None
    # effort: the chat's reasoning_effort (the template's variable); summary: echoed only.
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None  # OpenAI's stored conversations: refused, as stored responses
    prompt: Any = None  # a stored prompt template: refused
    background: bool | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if not value:
            raise ValueError("must not be empty")
        return value

    def to_chat(self, history: list[dict[str, Any]] = ()) -> ChatCompletionRequest:
        """The same request as a chat completion, continuing the items of `history` (a stored
        conversation). RequestFormatError names the field of this request that can't be
        served."""
        self._check_servable()
        fields = set(SamplingFields.model_fields) | set(ChatTemplateFields.model_fields)
        chat: dict[str, Any] = self.model_dump(by_alias=True, exclude_unset=True,
                                               include=fields)
        chat["messages"] = input_messages(self.input, self.instructions, history)
        if self.max_output_tokens is not None:
            chat["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            chat["tools"] = [_chat_tool(i, tool) for i, tool in enumerate(self.tools)]
        if self.tool_choice is not None:
            chat["tool_choice"] = _chat_tool_choice(self.tool_choice)
        chat["parallel_tool_calls"] = self.parallel_tool_calls
        if self.text is not None and self.text.format is not None:
            chat["response_format"] = self.text.format.response_format()
        if (self.reasoning or {}).get("effort") is not None:
            chat["reasoning_effort"] = self.reasoning["effort"]
        if self.top_logprobs is not None or OUTPUT_LOGPROBS in (self.include or ()):
            chat.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        return checked_chat(chat, "input")

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as items, each with an id (a string is one user message), as the response's
        input items are listed and a follow-up continues them."""
        items = ([{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": self.input}]}]
                 if isinstance(self.input, str) else self.input)
        return [item if "id" in item else
                {"id": new_item_id(_ITEM_ID_PREFIX.get(item.get("type", "message"), "item")),
                 **item} for item in items]

    def _check_servable(self) -> None:
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise RequestFormatError(name, "stored conversations and prompts are not "
                                         "kept by this server; send the conversation in input")
        if self.truncation == "auto":
            raise RequestFormatError("truncation", "'auto' is not supported; an input longer "
                                     "than the context is refused")
        if self.n != 1:
            raise RequestFormatError("n", "a response has one output; use "
                                     "/v1/chat/completions for several")

    def text_format(self) -> dict[str, Any]:
        """`text` as the response echoes it."""
        if self.text is None or self.text.format is None:
            return {"format": {"type": "text"}}
        return {"format": self.text.format.model_dump(by_alias=True, exclude_none=True)}


def checked_chat(chat: dict[str, Any], whole: str) -> ChatCompletionRequest:
    """A translated request as a chat request; RequestFormatError names the chat field at
    fault (the route words it as the field the client sent), or `whole` for the body."""
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        first = exc.errors()[0]
        error = first.get("ctx", {}).get("error")
        if isinstance(error, FieldError):  # a check across fields, naming the one at fault
            raise RequestFormatError(error.field, str(error)) from None
        where = ".".join(str(p) for p in first["loc"]) or whole
        raise RequestFormatError(where, first["msg"]) from None


def input_messages(items: str | list[dict[str, Any]], instructions: str | None = None,
                   history: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """`input` (and `instructions`) as chat messages, after the items of `history` (an earlier
    response's conversation, whose own instructions are not carried over, as OpenAI's are
    not)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    names: dict[str, str] = {}  # call_id -> function name, for the tool messages
    thought: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate([*history, *items]):
        where = (f"input[{i - len(history)}]" if i >= len(history)
                 else f"previous_response_id (its item {i})")
        kind = item.get("type", "message")
        if kind == "message":
            message = _message(where, item)
            if message["role"] == "assistant" and thought is not None:
                message["reasoning"], thought = thought, None
            messages.append(message)
        elif kind == "function_call":
            call = _function_call(where, item)
            names[call["id"]] = call["function"]["name"]
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            if thought is not None:
                last["reasoning"], thought = thought, None
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = text_field(where, item, "call_id")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _content_text(f"{where}.output", item.get("output")),
                             **({"name": names[call_id]} if call_id in names else {})})
        elif kind == "reasoning":
            thought = _reasoning_text(where, item)
        elif kind == "item_reference":
            raise RequestFormatError(f"{where}.type", "an item reference is read from the "
                                     "responses the server keeps; send the item itself")
        else:
            raise RequestFormatError(f"{where}.type", f"input items of type {kind!r} are not "
                                     "supported (message, function_call, "
                                     "function_call_output and reasoning are)")
    if not any(m["role"] != "system" for m in messages):
        raise RequestFormatError("input", "needs at least one message besides instructions")
    return messages


def _message(where: str, item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise RequestFormatError(f"{where}.role", "must be 'user', 'assistant', 'system' or "
                                 f"'developer', got {role!r}")
    content = item.get("content")
    if isinstance(content, list) and any(isinstance(part, dict) and
                                         part.get("type") == "input_image" for part in content):
        return {"role": role, "content": _content_parts(f"{where}.content", content)}
    return {"role": role, "content": _content_text(f"{where}.content", content)}


def _content_parts(where: str, content: list[Any]) -> list[dict[str, Any]]:
    """Content with images as chat completions' parts: text, and image_url for each
    input_image (its URL; an uploaded file's id needs stored files, which this server does
    not keep)."""
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise RequestFormatError(f"{where}[{j}].image_url", "is required and must be "
                                         "a URL string (file_id images are not supported)")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": _content_text(f"{where}[{j}]", [part])})
    return parts


def _content_text(where: str, content: Any) -> str:
    """A message's content (a string or a list of text parts) as one string, the parts one a
    line."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestFormatError(where, "must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise RequestFormatError(f"{where}[{j}].type", f"content of type {kind!r} is not "
                                     "supported: this server's model reads text only")
        texts.append(text_field(f"{where}[{j}]", part, _TEXT_PARTS[kind]))
    return "\n".join(texts)  # as the chat completions' parts are joined


def _function_call(where: str, item: dict[str, Any]) -> dict[str, Any]:
    return {"id": text_field(where, item, "call_id"), "type": "function",
            "function": {"name": text_field(where, item, "name"),
                         "arguments": text_field(where, item, "arguments")}}


def _reasoning_text(where: str, item: dict[str, Any]) -> str | None:
    """An earlier reply's thinking: its reasoning text, else its summary (None if neither)."""
    for key in ("content", "summary"):
        if item.get(key):
            return _content_text(f"{where}.{key}", item[key])
    return None


def text_field(where: str, item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise RequestFormatError(f"{where}.{key}", "is required and must be a string")
    return value


def _chat_tool(i: int, tool: Any) -> Any:
    """A Responses function tool ({"type": "function", "name", "parameters", ...}) in the chat
    shape ({"type": "function", "function": {...}})."""
    if not isinstance(tool, dict):
        return tool  # plan_tools names it
    if tool.get("type") != "function":
        raise RequestFormatError(f"tools[{i}].type", f"tools of type {tool.get('type')!r} are "
                                 "not supported: this server calls functions only")
    function = {k: v for k, v in tool.items() if k != "type"}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        raise RequestFormatError("tool_choice.type", "must be 'function' (or tool_choice one "
                                 "of 'none', 'auto', 'required')")
    if not isinstance(choice.get("name"), str):
        raise RequestFormatError("tool_choice.name", "is required")
    return {"type": "function", "function": {"name": choice["name"]}}
