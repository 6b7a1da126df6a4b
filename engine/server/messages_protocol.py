"""The request body of Anthropic's Messages API (POST /v1/messages), and its translation into a
chat completion request: `system` becomes a system message first, each message's content
blocks the chat shape (text and images as parts, an assistant's `tool_use` blocks its tool
calls and its `thinking` its reasoning, a user's `tool_result` blocks tool messages), `tools`
with their `input_schema` function tools, `tool_choice` the chat's, `stop_sequences` the stop
strings; a last message from the assistant is continued (Anthropic's prefill). The vLLM
sampling extensions of chat completions (min_p, seed, repetition_penalty,
chat_template_kwargs, ...) are taken as they are.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from tokenmill.engine.server.protocol import (
    ChatCompletionRequest,
    ChatTemplateFields,
    SamplingFields,
)
from tokenmill.engine.server.responses_protocol import (
    RequestFormatError,
    checked_chat,
    text_field,
)


class MessagesRequest(SamplingFields, ChatTemplateFields):
    model_config = ConfigDict(extra="ignore")

    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # required by /v1/messages
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # Anthropic's range
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    # enabled: the model thinks (a thinking block, under --reasoning-parser); disabled: the
    # template's enable_thinking is false. budget_tokens is not enforced: max_tokens bounds
    # the thinking and the answer together.
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None  # one tier here: taken and not echoed
    # Anthropic's hosted features: refused by name.
    mcp_servers: Any = None
    container: Any = None

    def to_chat(self, max_tokens: int | None = None) -> ChatCompletionRequest:
        """The same request as a chat completion (with `max_tokens` in place of the body's,
        for counting tokens). RequestFormatError names the field that can't be served."""
        for name in ("mcp_servers", "container"):
            if getattr(self, name) is not None:
                raise RequestFormatError(name, "not supported: this server runs no hosted "
                                         "tools or containers")
        fields = set(SamplingFields.model_fields) | set(ChatTemplateFields.model_fields)
        chat: dict[str, Any] = self.model_dump(by_alias=True, exclude_unset=True,
                                               include=fields - {"stop", "n"})
        system = (self.system if self.system is None or isinstance(self.system, str)
                  else _text_blocks("system", self.system))
        chat["messages"] = chat_messages(system, self.messages)
        prefilled = self.messages[-1].get("role") == "assistant"
        if prefilled and not {"add_generation_prompt",
                              "continue_final_message"} & self.model_fields_set:
            # Anthropic's prefill: the reply continues the last, assistant, message.
            chat.update(add_generation_prompt=False, continue_final_message=True)
        chat["max_completion_tokens"] = max_tokens or self.max_tokens
        if self.stop_sequences:
            chat["stop"] = self.stop_sequences
        if self.tools:
            chat["tools"] = [_chat_tool(i, tool) for i, tool in enumerate(self.tools)]
        if self.tool_choice is not None:
            chat.update(_chat_tool_choice(self.tool_choice))
        if self.metadata and isinstance(self.metadata.get("user_id"), str):
            chat["user"] = self.metadata["user_id"]
        if (self.thinking or {}).get("type") == "disabled":
            chat["chat_template_kwargs"] = {"enable_thinking": False,
                                            **(self.chat_template_kwargs or {})}
        return checked_chat(chat, "messages")


def chat_messages(system: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    names: dict[str, str] = {}  # tool_use id -> its tool's name, for the tool messages
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise RequestFormatError(f"{where}.role", f"must be 'user' or 'assistant', got "
                                     f"{role!r}")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise RequestFormatError(f"{where}.content", "must be a string or a list of "
                                     "content blocks")
        elif role == "assistant":
            out.append(_assistant(f"{where}.content", content, names))
        else:
            out += _user(f"{where}.content", content, names)
    return out


def _assistant(where: str, blocks: list[Any], names: dict[str, str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    texts, thoughts = [], []
    for j, block in enumerate(blocks):
        kind = _kind(f"{where}[{j}]", block)
        if kind == "text":
            texts.append(text_field(f"{where}[{j}]", block, "text"))
        elif kind == "thinking":
            thoughts.append(text_field(f"{where}[{j}]", block, "thinking"))
        elif kind == "redacted_thinking":
            continue  # another model's encrypted thinking: nothing this model can read
        elif kind == "tool_use":
            call_id = text_field(f"{where}[{j}]", block, "id")
            name = names[call_id] = text_field(f"{where}[{j}]", block, "name")
            message.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": json.dumps(block.get("input") or {})}})
        else:
            raise RequestFormatError(f"{where}[{j}].type", f"an assistant's {kind!r} block is "
                                     "not supported (text, thinking and tool_use are)")
    if texts:
        message["content"] = "".join(texts)
    if thoughts:
        message["reasoning"] = "".join(thoughts)
    return message


def _user(where: str, blocks: list[Any], names: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, its text and images as user messages,
    in the order the blocks come."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            images = any(part["type"] == "image_url" for part in parts)
            text = "\n".join(part["text"] for part in parts if part["type"] == "text")
            out.append({"role": "user", "content": list(parts) if images else text})
            parts.clear()

    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = _kind(at, block)
        if kind == "text":
            parts.append({"type": "text", "text": text_field(at, block, "text")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(at, block)}})
        elif kind == "tool_result":
            flush()
            call_id = text_field(at, block, "tool_use_id")
            result = block.get("content", "")
            text = result if isinstance(result, str) else _text_blocks(f"{at}.content", result)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text,
                        **({"name": names[call_id]} if call_id in names else {})})
        else:
            raise RequestFormatError(f"{at}.type", f"a user's {kind!r} block is not supported "
                                     "(text, image and tool_result are)")
    flush()
    return out


def _image_url(where: str, block: dict[str, Any]) -> str:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media = text_field(f"{where}.source", source, "media_type")
        return f"data:{media};base64,{text_field(f'{where}.source', source, 'data')}"
    if kind == "url":
        return text_field(f"{where}.source", source, "url")
    raise RequestFormatError(f"{where}.source.type", "must be 'base64' or 'url' (files are "
                             "not kept by this server)")


def _text_blocks(where: str, blocks: Any) -> str:
    """Text blocks (a system prompt's, a tool result's) as one string, a block a line."""
    if not isinstance(blocks, list):
        raise RequestFormatError(where, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(blocks):
        if _kind(f"{where}[{j}]", block) != "text":
            raise RequestFormatError(f"{where}[{j}].type", "only text blocks are supported "
                                     "here")
        texts.append(text_field(f"{where}[{j}]", block, "text"))
    return "\n".join(texts)


def _kind(where: str, block: Any) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise RequestFormatError(f"{where}.type", "a content block needs a type")
    return block["type"]


def _chat_tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A client tool ({"name", "description", "input_schema"}) as a chat function tool."""
    if tool.get("type") not in (None, "custom"):
        raise RequestFormatError(f"tools[{i}].type", f"tools of type {tool['type']!r} are not "
                                 "supported: this server calls the client's tools only")
    function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    kind = choice.get("type")
    chosen = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise RequestFormatError("tool_choice.name", "is required")
        chosen = {"type": "function", "function": {"name": choice["name"]}}
    if chosen is None:
        raise RequestFormatError("tool_choice.type", "must be 'auto', 'any', 'tool' or "
                                 f"'none', got {kind!r}")
    fields: dict[str, Any] = {"tool_choice": chosen}
    if choice.get("disable_parallel_tool_use"):
        fields["parallel_tool_calls"] = False
    return fields
