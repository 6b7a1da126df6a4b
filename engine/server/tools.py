"""A chat request's `tools` and `tool_choice`: checked, then turned into a plan.

The plan says which tools the chat template renders, which parser reads the reply, and, for
`required` or a named function, the JSON schema the reply must follow (so the model cannot
answer anything but a call). Errors name the field the way OpenAI does
(`tools[0].function.name`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tokenmill.engine.core import SamplingParams, StructuredOutputsParams
from tokenmill.engine.core.errors import SamplingParamsError, StructuredOutputsError
from tokenmill.engine.server.tool_parsers import (
    TOOL_CALL_PARSERS,
    NamedToolParser,
    RequiredToolParser,
    ToolCallStream,
    ToolParser,
    tool_call_message,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolRequestError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallMessage(BaseModel):
    """A call in an earlier assistant message, sent back by the client."""

    id: str | None = None
    type: str = "function"
    function: FunctionCall


@dataclass
class ToolPlan:
    template_tools: list[dict] | None = None  # what the chat template renders
    parser: ToolParser | None = None  # what reads the reply (None: plain content)
    schema: dict | None = None  # what the reply must satisfy (required / named choice)
    max_calls: int | None = None  # 1 when parallel_tool_calls is false
    keep_special_tokens: bool = False  # the parser looks for tags that may be special tokens


class ReplyToolCalls:
    """The tool calls in one request's replies: the assistant message of a finished choice, or
    a streamed choice's next delta. A reply that called a tool and stopped finishes with
    "tool_calls"."""

    def __init__(self, plan: ToolPlan):
        assert plan.parser is not None
        self.parser = plan.parser
        self.max_calls = plan.max_calls
        self.streams: dict[int, ToolCallStream] = {}

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        content, calls = tool_call_message(self.parser, text, self.max_calls)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return message, _finish(finish_reason, bool(calls))

    def delta(self, choice: int, text: str,
              finish_reason: str | None) -> tuple[dict, str | None]:
        stream = self.streams.setdefault(choice, ToolCallStream(self.parser, self.max_calls))
        content, calls = stream.update(text, final=finish_reason is not None)
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta, _finish(finish_reason, stream.called)


def _finish(finish_reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and finish_reason == "stop" else finish_reason


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
               auto_parser: str | None) -> ToolPlan:
    """Check the request's tools and choice. `auto_parser` is the server's
    --tool-call-parser when --enable-auto-tool-choice is on, else None."""
    functions = _check_tools(tools or [])
    if tool_choice is None:
        tool_choice = "auto" if functions else "none"
    if tool_choice == "none":
        return ToolPlan()
    if not functions:
        raise ToolRequestError("tool_choice", "is only allowed when tools are specified")
    max_calls = 1 if parallel_tool_calls is False else None
    rendered = _rendered(functions)
    if tool_choice == "auto":
        if auto_parser is None:
            raise ToolRequestError("tool_choice", '"auto" needs the server started with '
                                   "--enable-auto-tool-choice and --tool-call-parser")
        parser = TOOL_CALL_PARSERS[auto_parser]
        # Qwen3-Coder's parser reads each argument by its type in the request's schemas.
        made = parser(functions) if getattr(parser, "reads_tool_schemas", False) else parser()
        return ToolPlan(rendered, made, None, max_calls, keep_special_tokens=True)
    if tool_choice == "required":
        return ToolPlan(rendered, RequiredToolParser(),
                        required_schema(list(functions.values()), max_calls), max_calls)
    name = _named_choice(tool_choice)
    if name not in functions:
        raise ToolRequestError("tool_choice.function.name",
                               f"no function named {name!r} in tools")
    return ToolPlan(rendered, NamedToolParser(name), _parameters(functions[name]), 1)


def sampling_for_tools(params: SamplingParams, plan: ToolPlan) -> SamplingParams:
    """The request's sampling as its tools need it. A parser reads special tokens too: in
    some tokenizers (Hermes 2 Pro) `<tool_call>` is one, and Llama's `<|python_tag|>` is.
    `required` or a named function: the reply can only be the call(s), because every token
    is held to the plan's JSON schema (the structured-output machinery)."""
    changes: dict[str, Any] = {}
    if plan.keep_special_tokens:
        changes["skip_special_tokens"] = False
    try:
        if plan.schema is not None:
            changes["structured_outputs"] = StructuredOutputsParams(json=plan.schema)
        return dataclasses.replace(params, **changes)
    except (SamplingParamsError, StructuredOutputsError) as exc:
        raise ToolRequestError("tools", f"a function's parameters can't be enforced: "
                               f"{exc}") from exc


def required_schema(functions: list[dict], max_calls: int | None) -> dict:
    """A JSON array of one or more calls, each naming one of the functions. Each function's
    parameters sit deep in this document, so their local references (`#/$defs/...`, `#`) are
    rebased to where they now are."""
    where = (["#/items/properties/arguments"] if len(functions) == 1 else
             [f"#/items/anyOf/{i}/properties/arguments" for i in range(len(functions))])
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [f["name"]]},
                             "arguments": _rebased(_parameters(f), at)},
              "required": ["name", "arguments"], "additionalProperties": False}
             for f, at in zip(functions, where, strict=True)]
    schema: dict = {"type": "array", "minItems": 1,
                    "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if max_calls is not None:
        schema["maxItems"] = max_calls
    return schema


# Keywords of a schema whose values are data, not schemas: a "$ref" in them is no reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords of a schema whose values map names (any name, "enum" too) to schemas.
_MAP_KEYWORDS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                           "dependentSchemas"})


def _rebased(schema: Any, at: str) -> Any:
    """`schema` with each JSON-pointer `$ref` ("#" or "#/...") made relative to the pointer
    `at`; an anchor ("#name") names no place and stays."""
    if isinstance(schema, list):
        return [_rebased(item, at) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = at + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _MAP_KEYWORDS and isinstance(value, dict):
            out[key] = {name: _rebased(sub, at) for name, sub in value.items()}
        else:
            out[key] = _rebased(value, at)
    return out


def template_tool_calls(calls: list[ToolCallMessage]) -> list[dict]:
    """Earlier calls for the chat template. Templates write the arguments with `tojson`, so
    they get the decoded object rather than the JSON string the API carries."""
    out = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.function.arguments)
        except ValueError:
            arguments = call.function.arguments
        out.append({"id": call.id, "type": "function",
                    "function": {"name": call.function.name, "arguments": arguments}})
    return out


def template_tools(tools: list[Any] | None) -> list[dict] | None:
    """The request's tools as the chat template renders them (checked as plan_tools checks
    them); None without any."""
    functions = _check_tools(tools or [])
    return _rendered(functions) if functions else None


def _rendered(functions: dict[str, dict]) -> list[dict]:
    return [{"type": "function", "function": f} for f in functions.values()]


def _check_tools(tools: list[Any]) -> dict[str, dict]:
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ToolRequestError(where, "must be an object")
        if tool.get("type") != "function":
            raise ToolRequestError(f"{where}.type",
                                   f"must be 'function', got {tool.get('type')!r}")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolRequestError(f"{where}.function", "is required and must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolRequestError(f"{where}.function.name", "is required: 1 to 64 letters, "
                                   "digits, underscores or dashes")
        if name in functions:
            raise ToolRequestError(f"{where}.function.name", f"{name!r} is defined twice")
        parameters = function.get("parameters")
        if parameters is not None and (not isinstance(parameters, dict)
                                       or parameters.get("type", "object") != "object"):
            raise ToolRequestError(f"{where}.function.parameters",
                                   "must be a JSON Schema object with type 'object'")
        functions[name] = function
    return functions


def _named_choice(tool_choice: Any) -> str:
    if isinstance(tool_choice, str):
        raise ToolRequestError("tool_choice", "must be 'none', 'auto', 'required' or "
                               f"{{'type': 'function', 'function': {{'name': ...}}}}, "
                               f"got {tool_choice!r}")
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function":
        raise ToolRequestError("tool_choice.type", "must be 'function'")
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ToolRequestError("tool_choice.function.name", "is required")
    return name


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}
