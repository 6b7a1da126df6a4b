"""Tool calls in generated text: one parser per model format, and their OpenAI shape.

A parser reads the whole text generated so far and says what of it is message content and
which tool calls it holds (a call's name once its string is complete, its arguments JSON text
as far as it has come). Streaming re-parses the growing text and sends what is new since the
last chunk, so the streamed deltas always join to the non-streamed message. Text that may be
the start of a tool call is held back until it is clear.

Formats: `hermes` (Hermes, Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
several per message), `llama3_json` (Llama 3.x: the whole reply is
`{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several joined by `;`),
`mistral` (`[TOOL_CALLS]` then a JSON array of call objects, or, from Mistral's v11
tokenizers, `NAME[ARGS]{...}` after each `[TOOL_CALLS]`) and `pythonic` (Llama 3.2 and 4: the
whole reply is a Python list of calls, `[get_weather(city="Paris"), get_time()]`; a call's
arguments are sent once its closing parenthesis is generated), `granite` (Granite 3.x: the
reply is `<|tool_call|>` then a JSON array of call objects) and `phi4_mini_json` (Phi-4-mini:
`functools[...]`, a JSON array of call objects after any content), `glm45` (GLM-4.5:
`<tool_call>NAME` then `<arg_key>`/`<arg_value>` pairs) and `openai` (GPT-OSS's harmony
messages to `functions.NAME`).
Forced tool choices produce JSON under a schema: the arguments object alone when one function
is named, `[{"name": ..., "arguments": {...}}, ...]` when any call is required.
"""

from __future__ import annotations

import ast
import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tokenmill.engine.server.harmony import held_plain, is_harmony, parse_messages
from tokenmill.engine.server.partial_markers import partial_marker_length

_WS = " \t\r\n"
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class ToolCallText:
    """One call as far as it has been generated."""

    name: str | None = None  # set once the name string is complete
    arguments: str = ""  # the arguments' JSON text so far (grows by appending)


@dataclass
class Parse:
    content: str  # message content that is safe to send
    calls: list[ToolCallText] = field(default_factory=list)

    def named_calls(self, limit: int | None = None) -> list[ToolCallText]:
        """The calls up to the first whose name is not complete yet. A call counts from the
        moment its name is known (streaming sends it then), so a reply cut short by
        max_tokens, or whose arguments go wrong, is still that call, streamed or not."""
        named = []
        for call in self.calls[:limit]:
            if call.name is None:
                break
            named.append(call)
        return named


class ToolParser(Protocol):
    def parse(self, text: str, final: bool) -> Parse: ...


class _Malformed(Exception):
    pass


# ---- formats ------------------------------------------------------------------------------

class HermesToolParser:
    """`<tool_call>{...}</tool_call>` blocks; content is the text before the first one."""

    START, END = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> Parse:
        first = text.find(self.START)
        if first < 0:
            return _content_only(text, self.START, final)
        result = _scan_calls(text, first + len(self.START), self._next_call)
        result.content = text[:first]
        return result

    def _next_call(self, text: str, i: int) -> int:
        if not text.startswith(self.END, i):
            return -1
        start = text.find(self.START, i + len(self.END))
        return start + len(self.START) if start >= 0 else -1


class Llama3JsonToolParser:
    """A reply that is JSON call objects (after an optional `<|python_tag|>`), `;`-separated."""

    TAG = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> Parse:
        i = _skip_ws(text, 0)
        if text.startswith(self.TAG, i):
            i = _skip_ws(text, i + len(self.TAG))
        elif not final and self.TAG.startswith(text[i:]):
            return Parse("")  # nothing yet, or what may become the tag
        if i < len(text) and text[i] == "{":
            return _scan_calls(text, i, _separated_by(";"))
        return Parse("" if i == len(text) and not final else text)


class MistralToolParser:
    """Content, then `[TOOL_CALLS]` and the calls: a JSON array of call objects, or
    `NAME[ARGS]{...}` repeated after each `[TOOL_CALLS]` (v11 tokenizers on)."""

    START, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def parse(self, text: str, final: bool) -> Parse:
        first = text.find(self.START)
        if first < 0:
            return _content_only(text, self.START, final)
        i = _skip_ws(text, first + len(self.START))
        if text.startswith("[", i):
            result = _scan_calls(text, i + 1, _separated_by(","))
        elif text.startswith("{", i):
            result = _scan_calls(text, i, _separated_by(","))
        else:
            result = self._named_calls(text, i)
        result.content = text[:first]
        return result

    def _named_calls(self, text: str, i: int) -> Parse:
        result = Parse("")
        while (args := text.find(self.ARGS, i)) >= 0:
            name = text[i:args].strip()
            if not name or any(c in name for c in _WS + '{}[]"'):
                break
            call = ToolCallText(name)
            result.calls.append(call)
            j = _skip_ws(text, args + len(self.ARGS))
            if not text.startswith("{", j):
                break
            end = _value_end(text, j)
            call.arguments = text[j:] if end is None else text[j:end]
            if end is None:
                break
            k = _skip_ws(text, end)
            if not text.startswith(self.START, k):
                break
            i = _skip_ws(text, k + len(self.START))
        return result


class PythonicToolParser:
    """A reply that is a Python list of calls with keyword arguments of literal values; each
    call's arguments become a JSON object once its closing parenthesis is there (until then,
    and for arguments that are not literals, they are empty)."""

    def parse(self, text: str, final: bool) -> Parse:
        i = _skip_ws(text, 0)
        if i == len(text):
            return Parse(text if final else "")
        if text[i] != "[":
            return Parse(text)
        result = Parse("")
        i += 1
        while True:
            i = _skip_ws(text, i)
            name_end = _identifier_end(text, i)
            if name_end == len(text):
                break  # the name may go on
            if name_end == i or text[name_end] != "(":
                return result if result.calls else Parse(text)  # a list, but not of calls
            call = ToolCallText(text[i:name_end])
            result.calls.append(call)
            end = _closing_end(text, name_end, "'\"")
            if end is None:
                break
            arguments = _python_keywords(text[i:end])
            if arguments is None:
                break
            call.arguments = arguments
            i = _skip_ws(text, end)
            if not text.startswith(",", i):
                break
            i += 1
        return result


class GraniteToolParser:
    """Granite 3.x: the reply is `<|tool_call|>` (or `<tool_call>`) then a JSON array of call
    objects; a reply that does not start so is content."""

    STARTS = ("<|tool_call|>", "<tool_call>")

    def parse(self, text: str, final: bool) -> Parse:
        i = _skip_ws(text, 0)
        start = next((tag for tag in self.STARTS if text.startswith(tag, i)), None)
        if start is None:
            waiting = not final and any(tag.startswith(text[i:]) for tag in self.STARTS)
            return Parse("" if waiting else text)
        i = _skip_ws(text, i + len(start))
        if i == len(text) or text[i] != "[":
            return Parse("" if i == len(text) and not final else text)
        return _scan_calls(text, i + 1, _separated_by(","))


class Phi4MiniJsonToolParser:
    """Phi-4-mini: content, then `functools` and a JSON array of call objects."""

    START = "functools["

    def parse(self, text: str, final: bool) -> Parse:
        first = text.find(self.START)
        if first < 0:
            return _content_only(text, self.START, final)
        result = _scan_calls(text, first + len(self.START), _separated_by(","))
        result.content = text[:first]
        return result


class RequiredToolParser:
    """`tool_choice: "required"`: a JSON array of `{"name", "arguments"}` objects. The reply
    is never content: one cut by max_tokens before its first name is whole has no call and no
    content, rather than the JSON it had begun (`owns_content`)."""

    owns_content = True

    def parse(self, text: str, final: bool) -> Parse:
        i = _skip_ws(text, 0)
        if i < len(text) and text[i] == "[":
            return _scan_calls(text, i + 1, _separated_by(","))
        return Parse("")


class NamedToolParser:
    """A named `tool_choice`: the whole reply is that function's arguments object."""

    def __init__(self, name: str):
        self.name = name

    def parse(self, text: str, final: bool) -> Parse:
        return Parse("", [ToolCallText(self.name, text.lstrip(_WS))])


class Glm45ToolParser:
    """GLM-4.5's calls: `<tool_call>NAME` then `<arg_key>KEY</arg_key><arg_value>VALUE
    </arg_value>` pairs, then `</tool_call>`; content is the text before the first call. A
    value that reads as JSON (a number, true, a list, an object) is that JSON, any other a
    string. A call's arguments grow a pair at a time, once its value is closed."""

    START, END = "<tool_call>", "</tool_call>"
    KEY, VALUE = ("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>")

    def parse(self, text: str, final: bool) -> Parse:
        return _tagged_calls(text, self.START, final, self._call)

    def _call(self, block: str, final: bool) -> ToolCallText | None:
        body, closed = block.partition(self.END)[0], self.END in block
        name_end = min((at for at in (body.find("\n"), body.find(self.KEY[0])) if at >= 0),
                       default=-1 if not closed else len(body))
        if name_end < 0 and not final:
            return None  # the name may still be growing
        name = body[:name_end if name_end >= 0 else len(body)].strip()
        if not name:
            return None
        pairs = []
        for piece in body.split(self.KEY[0])[1:]:
            key, found, rest = piece.partition(self.KEY[1])
            value, ended, _ = rest.partition(self.VALUE[1])
            if not (found and ended and self.VALUE[0] in value):
                break
            pairs.append((key.strip(), _json_value(value.partition(self.VALUE[0])[2])))
        return ToolCallText(name, _pairs_arguments(pairs, closed or final))


class DeepSeekV3ToolParser:
    """DeepSeek-V3's and R1's calls: `<｜tool▁calls▁begin｜>`, then for each call
    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` and its arguments fenced as a JSON code block
    (```` ```json ````) before `<｜tool▁call▁end｜>`; content is the text before the calls.
    Streaming, the arguments grow as written, less a tail that may begin the fence's or the
    call's end (and less trailing blanks, which only ever become inner ones)."""

    START = "<｜tool▁calls▁begin｜>"
    CALL, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    FENCE, FENCE_END = "```json", "```"
    fenced = True

    def parse(self, text: str, final: bool) -> Parse:
        return _tagged_calls(text, self.CALL, final, self._call, section=self.START)

    def _call(self, block: str, final: bool) -> ToolCallText | None:
        head, sep, rest = block.partition(self.SEP)
        if not sep:
            return None  # the name (V3.1) or the call's type (V3) may still be growing
        body, closed = rest.partition(self.CALL_END)[0], self.CALL_END in rest
        ended = closed or final
        if not ended:
            body = body[:len(body) - partial_marker_length(body, (self.CALL_END,))]
        call = self._fenced(body, ended) if self.fenced else \
            ToolCallText(head.strip(_WS) or None, body.strip(_WS))
        return None if call.name is None else call

    def _fenced(self, body: str, ended: bool) -> ToolCallText:
        """NAME, a line break, then ```json, the arguments and ```."""
        name, newline, rest = body.partition("\n")
        if not newline and not ended:
            return ToolCallText()  # the name may still be growing
        start = rest.find(self.FENCE)
        arguments = "" if start < 0 else rest[start + len(self.FENCE):]
        end = arguments.find(self.FENCE_END)
        if end >= 0:
            arguments = arguments[:end]
        elif not ended:
            arguments = arguments[:len(arguments) -
                                  partial_marker_length(arguments, (self.FENCE_END,))]
        return ToolCallText(name.strip(_WS) or None, arguments.strip(_WS))


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    """DeepSeek-V3.1's calls: V3's markers, the name before the separator and the bare JSON
    arguments after it."""

    fenced = False


class Qwen3CoderToolParser:
    """Qwen3-Coder's calls: `<tool_call>`, `<function=NAME>`, each argument as
    `<parameter=KEY>` VALUE `</parameter>`, then `</function>` and `</tool_call>`; content is
    the text before the first call. A value (less the line break on each side) is read as its
    parameter's type in the request's tool schema says: a string as written, a number,
    boolean, array or object as JSON (a string where it does not parse); without a type, as
    JSON where it parses, else a string. A call's arguments grow a parameter at a time."""

    START, END = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_END = "<function=", "</function>"
    PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
    reads_tool_schemas = True

    def __init__(self, functions: dict[str, dict] | None = None):
        self.functions = functions or {}

    def parse(self, text: str, final: bool) -> Parse:
        return _tagged_calls(text, self.START, final, self._call)

    def _call(self, block: str, final: bool) -> ToolCallText | None:
        body = block.partition(self.END)[0]
        closed = self.END in block or self.FUNCTION_END in body
        head = body.find(self.FUNCTION)
        name_end = body.find(">", head) if head >= 0 else -1
        name = body[head + len(self.FUNCTION):name_end].strip() if name_end >= 0 else ""
        if not name:
            return None  # no call yet, or its name still growing
        pairs = []
        for piece in body[name_end + 1:].split(self.PARAMETER)[1:]:
            key, found, rest = piece.partition(">")
            value, ended, _ = rest.partition(self.PARAMETER_END)
            if not (found and ended):
                break
            pairs.append((key.strip(), self._value(name, key.strip(), value)))
        return ToolCallText(name, _pairs_arguments(pairs, closed or final))

    def _value(self, function: str, key: str, text: str) -> str:
        """An argument's value as JSON text, by its type in the tool's schema."""
        text = text.removeprefix("\n").removesuffix("\n")
        schema = (self.functions.get(function) or {}).get("parameters") or {}
        kind = ((schema.get("properties") or {}).get(key) or {}).get("type")
        if kind == "string":
            return json.dumps(text)
        return _json_value(text)


class MiniMaxM2ToolParser(Qwen3CoderToolParser):
    """MiniMax-M2's calls: `<minimax:tool_call>`, then for each call `<invoke name="NAME">`
    with each argument as `<parameter name="KEY">VALUE</parameter>`, then `</invoke>`, and
    `</minimax:tool_call>` after the last; content is the text before the first. Values are
    read by their schemas' types as Qwen3-Coder's are; arguments grow a parameter at a time."""

    START = "<minimax:tool_call>"
    INVOKE, INVOKE_END = '<invoke name="', "</invoke>"
    PARAMETER, PARAMETER_END = '<parameter name="', "</parameter>"

    def parse(self, text: str, final: bool) -> Parse:
        return _tagged_calls(text, self.INVOKE, final, self._call, section=self.START)

    def _call(self, block: str, final: bool) -> ToolCallText | None:
        body, closed = block.partition(self.INVOKE_END)[0], self.INVOKE_END in block
        name, found, rest = body.partition('">')
        if not found or not name.strip():
            return None  # the name may still be growing
        pairs = []
        for piece in rest.split(self.PARAMETER)[1:]:
            key, found, tail = piece.partition('">')
            value, ended, _ = tail.partition(self.PARAMETER_END)
            if not (found and ended):
                break
            pairs.append((key.strip(), self._value(name.strip(), key.strip(), value)))
        return ToolCallText(name.strip(), _pairs_arguments(pairs, closed or final))


def _tagged_calls(text: str, start: str, final: bool,
                  call_of: Callable[[str, bool], ToolCallText | None],
                  section: str | None = None) -> Parse:
    """A reply whose calls each open with `start`, all after `section` where the format opens
    a section of calls (else after the first start): the content is the text before it;
    `call_of(block, final)` reads the text after each start (None: no call there yet, which
    ends the list)."""
    opening = section or start
    first = text.find(opening)
    if first < 0:
        return _content_only(text, opening, final)
    calls = []
    for block in text[first:].split(start)[1:]:
        call = call_of(block, final)
        if call is None:
            break
        calls.append(call)
    return Parse(text[:first], calls)


def _pairs_arguments(pairs: list[tuple[str, str]], closed: bool) -> str:
    """A JSON object's text from (key, value as JSON text) pairs, the brace closed once the
    call is."""
    body = ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs)
    return "{" + body + ("}" if closed else "")


def _json_value(text: str) -> str:
    """A GLM argument value as JSON text: itself where it parses as JSON, else a string."""
    try:
        return json.dumps(json.loads(text))
    except ValueError:
        return json.dumps(text)


class OpenAIToolParser:
    """GPT-OSS's harmony (server/harmony.py): each message to `functions.NAME` is a call, its
    content the arguments; the content is the final answer and any preamble, without the
    thinking and without the markers, whether or not a call was made (`owns_content`)."""

    owns_content = True

    def parse(self, text: str, final: bool) -> Parse:
        if not is_harmony(text):
            return Parse(held_plain(text, final))
        messages = parse_messages(text, final)
        content = "".join(m.content for m in messages if not m.thinking and not m.recipient)
        calls = [ToolCallText(m.recipient.removeprefix("functions."), m.content)
                 for m in messages if m.recipient]
        return Parse(content, calls)


TOOL_CALL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
    "granite": GraniteToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
    "openai": OpenAIToolParser,
    "glm45": Glm45ToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
    "minimax_m2": MiniMaxM2ToolParser,
}


# ---- OpenAI shapes ------------------------------------------------------------------------

def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_message(parser: ToolParser, text: str,
                      max_calls: int | None = None) -> tuple[str | None, list[dict]]:
    """message.content and message.tool_calls of a finished reply: what streaming the same
    text would have sent, in whatever pieces."""
    parsed = parser.parse(text, final=True)
    calls = [{"id": new_tool_call_id(), "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}}
             for c in parsed.named_calls(max_calls)]
    if not calls:
        return (parsed.content if _owns_content(parser) else text), []
    return (parsed.content if parsed.content.strip() else None), calls


class ToolCallStream:
    """The streamed form of one choice: each update returns the content and tool-call deltas
    that the text added since the last one. Whitespace-only content waits: before a call it
    is dropped, as the non-streamed message drops it."""

    def __init__(self, parser: ToolParser, max_calls: int | None = None):
        self.parser = parser
        self.max_calls = max_calls
        self.content_sent = 0
        self.sent: list[tuple[str, str]] = []  # per call: its id, the arguments text sent

    def update(self, text: str, final: bool) -> tuple[str, list[dict]]:
        parsed = self.parser.parse(text, final)
        content, calls = parsed.content, parsed.named_calls(self.max_calls)
        if final and not calls and not _owns_content(self.parser):
            content = text  # no tool call after all: what was held back is content
        content_delta = ""
        if content.strip() or (final and not calls):
            content_delta = content[self.content_sent:]
            self.content_sent = max(self.content_sent, len(content))
        deltas = []
        for index, call in enumerate(calls):
            if index == len(self.sent):
                self.sent.append((new_tool_call_id(), call.arguments))
                deltas.append({"index": index, "id": self.sent[index][0], "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}})
                continue
            call_id, sent = self.sent[index]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                deltas.append({"index": index,
                               "function": {"arguments": call.arguments[len(sent):]}})
                self.sent[index] = (call_id, call.arguments)
        return content_delta, deltas

    @property
    def called(self) -> bool:
        return bool(self.sent)


# ---- scanning JSON as it grows ------------------------------------------------------------

def _owns_content(parser: ToolParser) -> bool:
    """Whether the parser's content is the message content even without a call (a format
    whose markup is never content, such as harmony's)."""
    return getattr(parser, "owns_content", False)


def _scan_calls(text: str, i: int, next_call: Callable[[str, int], int]) -> Parse:
    """Call objects from text[i] on. `next_call(text, j)`, with j just past a call and its
    trailing whitespace, says where the next call may start (-1: the calls are over)."""
    result = Parse("")
    with contextlib.suppress(_Malformed):  # a malformed call ends the calls
        while i >= 0:
            i = _skip_ws(text, i)
            if i == len(text) or text[i] != "{":
                break
            end = _scan_call(text, i, result.calls)
            if end is None:
                break
            i = next_call(text, _skip_ws(text, end))
    return result


def _separated_by(separator: str) -> Callable[[str, int], int]:
    return lambda text, i: i + len(separator) if text.startswith(separator, i) else -1


def _scan_call(text: str, start: int, calls: list[ToolCallText]) -> int | None:
    """Append the call object at text[start] ('{') to `calls`, as far as it is known, and
    return the index just past its closing brace (None while it is open). Raises _Malformed
    where it stops being a call object, what was known of it already appended."""
    call = ToolCallText()
    calls.append(call)
    has_arguments = False
    i = start + 1
    while True:
        i = _skip_ws(text, i)
        if i == len(text):
            return None
        if text[i] == "}":
            if not has_arguments:
                call.arguments = "{}"  # a function without parameters
            return i + 1
        if text[i] != '"':
            raise _Malformed
        key_end = _value_end(text, i)
        if key_end is None:
            return None
        key = _loads(text[i:key_end])
        i = _skip_ws(text, key_end)
        if i == len(text):
            return None
        if text[i] != ":":
            raise _Malformed
        i = _skip_ws(text, i + 1)
        if i == len(text):
            return None
        end = _value_end(text, i)
        if key == "name" and end is not None:
            name = _loads(text[i:end])
            if not isinstance(name, str):
                raise _Malformed
            call.name = name
        elif key in _ARGUMENT_KEYS and not has_arguments:
            has_arguments = True
            call.arguments = text[i:] if end is None else text[i:end]
        if end is None:
            return None
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i += 1
        elif i < len(text) and text[i] != "}":
            raise _Malformed


def _value_end(text: str, i: int) -> int | None:
    """Index just past the JSON value starting at text[i], or None if it is not complete."""
    first = text[i]
    if first == '"':
        j = i + 1
        while j < len(text):
            if text[j] == "\\":
                j += 2
            elif text[j] == '"':
                return j + 1
            else:
                j += 1
        return None
    if first in "{[":
        return _closing_end(text, i, '"')
    j = i
    while j < len(text) and text[j] not in ",}]" + _WS:
        j += 1
    return j if j < len(text) else None  # a number or literal is whole once something follows


def _identifier_end(text: str, i: int) -> int:
    """Index just past the Python identifier at text[i] (i itself: none there)."""
    j = i
    while j < len(text) and (text[j] == "_" or text[j].isalnum()):
        j += 1
    return i if j > i and text[i].isdigit() else j


def _closing_end(text: str, i: int, quotes: str) -> int | None:
    """Index just past the bracket that closes the one at text[i], nested brackets and
    strings (in any of `quotes`, with backslash escapes) skipped; None while it is open."""
    depth, j, quote = 0, i, None
    while j < len(text):
        ch = text[j]
        if quote:
            if ch == "\\":
                j += 1
            elif ch == quote:
                quote = None
        elif ch in quotes:
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _python_keywords(call: str) -> str | None:
    """The keyword arguments of one complete Python call of literals, as a JSON object; None
    if it is no such call."""
    try:
        node = ast.parse(call, mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            return None
        return json.dumps({k.arg: ast.literal_eval(k.value) for k in node.keywords},
                          ensure_ascii=False)
    except (SyntaxError, ValueError, TypeError):
        return None


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _Malformed from exc


def _content_only(text: str, start: str, final: bool) -> Parse:
    """A reply with no call's start marker yet: all content, less (streaming) a tail that may
    begin the marker."""
    keep = len(text) if final else len(text) - partial_marker_length(text, (start,))
    return Parse(text[:keep])


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i
