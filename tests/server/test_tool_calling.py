"""Tool calling over real HTTP with the official `openai` client: tools rendered by the chat
template, replies parsed into message.tool_calls (and streamed as deltas), tool_choice, and
400s naming the bad field. The models are scripted (tests/server/tool_support.py): greedy
decoding writes a known tool call, in pieces that split tags and JSON, through the real engine."""

from __future__ import annotations

import contextlib
import json

import openai
import pytest
from server_support import in_process_server
from tool_support import (
    HERMES_REPLY,
    HERMES_SPECIAL,
    HERMES_TEMPLATE,
    LLAMA3_REPLY,
    LLAMA3_TEMPLATE,
    MISTRAL_REPLY,
    MISTRAL_SPECIAL,
    MISTRAL_TEMPLATE,
    PYTHONIC_REPLY,
    PYTHONIC_TEMPLATE,
    QWEN3_CODER_REPLY,
    make_scripted_model,
)

from tokenmill.engine.cli import main as cli_main

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object",
                                       "properties": {"zone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "Weather in Paris, and the time in CET?"}]


@contextlib.contextmanager
def scripted_server(tmp_path_factory, base_tokenizer, template: str, reply: list[str],
                    parser: str, special: tuple[str, ...] = ()):
    directory = make_scripted_model(str(tmp_path_factory.mktemp(parser)), base_tokenizer,
                                    template, reply, special)
    options = {"enable_auto_tool_choice": True, "tool_call_parser": parser}
    with in_process_server(directory, parser, options=options, max_num_seqs=8) as server:
        yield server.state, server.client


@pytest.fixture(scope="module")
def hermes(tmp_path_factory, smol_tokenizer):
    with scripted_server(tmp_path_factory, smol_tokenizer, HERMES_TEMPLATE, HERMES_REPLY,
                         "hermes", HERMES_SPECIAL) as server:
        yield server


@pytest.fixture(scope="module")
def llama3(tmp_path_factory, smol_tokenizer):
    with scripted_server(tmp_path_factory, smol_tokenizer, LLAMA3_TEMPLATE, LLAMA3_REPLY,
                         "llama3_json") as server:
        yield server


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def reassemble(chunks) -> dict[int, dict]:
    """Each choice's content and tool calls, joined from streamed deltas as a client does."""
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            out = choices.setdefault(choice.index, {"content": "", "calls": [], "finish": None})
            out["content"] += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                if delta.index == len(out["calls"]):
                    assert delta.id.startswith("call_") and delta.type == "function"
                    out["calls"].append({"id": delta.id, "name": delta.function.name,
                                         "arguments": ""})
                else:
                    assert delta.id is None and delta.function.name is None
                out["calls"][delta.index]["arguments"] += delta.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return choices


def test_hermes_calls_in_the_message(hermes):
    _, client = hermes
    r = client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    assert calls_of(choice.message) == [("get_weather", {"city": "Paris", "days": 3}),
                                        ("get_time", {"zone": "CET"})]
    ids = [c.id for c in choice.message.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    assert all(c.type == "function" for c in choice.message.tool_calls)


def test_hermes_calls_streamed_as_deltas(hermes):
    _, client = hermes
    full = client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                          temperature=0)
    chunks = list(client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                                 temperature=0, stream=True, n=2))
    for index in (0, 1):
        got = reassemble(chunks)[index]
        assert got["finish"] == "tool_calls"
        assert got["content"] == full.choices[0].message.content  # "<tool" never leaks
        assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
            (c.function.name, c.function.arguments) for c in full.choices[0].message.tool_calls]
    # Each call comes as deltas of its own. That arguments stream as the model writes them, not
    # in one piece at the end, is test_tool_parsers' to show (a parser fed token by token):
    # here a reader behind the engine takes the steps it missed in one chunk, so how many
    # fragments a call gets depends on the machine's load.
    fragments = [d for c in chunks for ch in c.choices if ch.index == 0
                 for d in ch.delta.tool_calls or []]
    assert sorted({d.index for d in fragments}) == [0, 1]


def test_the_clients_stream_helper_assembles_the_calls(hermes):
    _, client = hermes
    with client.chat.completions.stream(model="hermes", messages=ASK, tools=TOOLS,
                                        temperature=0) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert calls_of(final.choices[0].message)[0] == ("get_weather", {"city": "Paris", "days": 3})


def test_llama3_json_calls(llama3):
    _, client = llama3
    r = client.chat.completions.create(model="llama3_json", messages=ASK, tools=TOOLS,
                                       temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    assert calls_of(r.choices[0].message) == [("get_weather", {"city": "Paris", "days": 3})]
    chunks = list(client.chat.completions.create(model="llama3_json", messages=ASK,
                                                 tools=TOOLS, temperature=0, stream=True))
    got = reassemble(chunks)[0]
    assert got["content"] == "" and got["finish"] == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == calls_of(
        r.choices[0].message)


@pytest.mark.parametrize("parser, template, reply, special, content, calls", [
    ("mistral", MISTRAL_TEMPLATE, MISTRAL_REPLY, MISTRAL_SPECIAL, "Sure, checking.",
     [("get_weather", {"city": "Paris", "days": 3})]),
    ("pythonic", PYTHONIC_TEMPLATE, PYTHONIC_REPLY, (), None,
     [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]),
    # The request's schema makes "75001" a string (city) and 3 an integer (days).
    ("qwen3_coder", PYTHONIC_TEMPLATE, QWEN3_CODER_REPLY, (), None,
     [("get_weather", {"city": "75001", "days": 3})]),
])
def test_mistral_pythonic_and_qwen3_coder_calls(tmp_path_factory, smol_tokenizer, parser,
                                                template, reply, special, content, calls):
    """Mistral's markers are special tokens: the parser sees them only because a request
    with tools keeps special tokens in the text."""
    with scripted_server(tmp_path_factory, smol_tokenizer, template, reply, parser,
                         special) as (_, client):
        r = client.chat.completions.create(model=parser, messages=ASK, tools=TOOLS,
                                           temperature=0)
        chunks = list(client.chat.completions.create(model=parser, messages=ASK, tools=TOOLS,
                                                     temperature=0, stream=True))
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content == content
    assert calls_of(r.choices[0].message) == calls
    got = reassemble(chunks)[0]
    assert got["content"] == (content or "") and got["finish"] == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == calls


def test_tool_choice_none_renders_and_parses_no_tools(hermes):
    state, client = hermes
    r = client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                       tool_choice="none", temperature=0)
    # Plain text, with special tokens skipped as in any reply without tool parsing.
    text = "".join(p for p in HERMES_REPLY if p not in HERMES_SPECIAL)
    assert r.choices[0].message.content == text
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
    plain = state.tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    assert r.usage.prompt_tokens == len(state.tokenizer.encode(plain, add_special_tokens=False))
    chunks = list(client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                                 tool_choice="none", temperature=0,
                                                 stream=True))
    assert reassemble(chunks)[0]["content"] == text


def test_parallel_tool_calls_false_keeps_one_call(hermes):
    _, client = hermes
    r = client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                       temperature=0, parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    chunks = list(client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                                 temperature=0, parallel_tool_calls=False,
                                                 stream=True))
    assert [c["name"] for c in reassemble(chunks)[0]["calls"]] == ["get_weather"]


@pytest.mark.parametrize("template", ["hermes", "llama3"])
def test_tools_calls_and_results_reach_the_template(template, request):
    """The prompt the server builds is the template rendered with the tools, the assistant's
    earlier call (arguments as an object, not a JSON string) and the tool's result."""
    state, client = request.getfixturevalue(template)
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    r = client.chat.completions.create(model=state.options.served_model_name,
                                       messages=history, tools=TOOLS, temperature=0,
                                       max_tokens=1)
    by_hand = [*ASK,
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    expected = state.tokenizer.apply_chat_template(by_hand, tools=TOOLS, tokenize=False,
                                                   add_generation_prompt=True)
    args_key = "arguments" if template == "hermes" else "parameters"
    assert f'{{"name": "get_weather", "{args_key}": {{"city": "Paris"}}}}' in expected
    assert '{"temp_c": 21}' in expected and '"description": "Current weather' in expected
    assert r.usage.prompt_tokens == len(state.tokenizer.encode(expected,
                                                               add_special_tokens=False))


BAD_TOOL_REQUESTS = [
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [WEATHER, {"type": "function", "function": {"description": "no name"}}]},
     "tools[1].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f",
                                                  "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function"}]}]},
     "messages"),
]


@pytest.mark.parametrize("fields,param", BAD_TOOL_REQUESTS)
def test_bad_tools_are_400_naming_the_field(hermes, fields, param):
    _, client = hermes
    body = {"model": "hermes", "messages": ASK, "max_tokens": 1} | fields
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    error = err.value.response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]


def test_auto_choice_needs_the_server_flags(hermes):
    state, client = hermes
    state.options.enable_auto_tool_choice = False
    try:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS)
        assert "--enable-auto-tool-choice" in err.value.response.json()["error"]["message"]
        r = client.chat.completions.create(model="hermes", messages=ASK, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=2)
        assert r.choices[0].finish_reason == "length"
    finally:
        state.options.enable_auto_tool_choice = True


def test_serve_flags(capsys):
    assert cli_main(["serve", "--model", "unused", "--enable-auto-tool-choice"]) == 2
    assert "--tool-call-parser" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli_main(["serve", "--tool-call-parser", "jamba"])
    assert exit_.value.code == 2


# ---- tool_choice "required" and a named function: forced through a JSON schema -------------

ALARM = {"type": "function", "function": {
    "name": "set_alarm", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["hour", "mode"],
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                       "mode": {"enum": ["once", "daily"]}}}}}
LIGHTS = {"type": "function", "function": {
    "name": "lights", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["on"],
        "properties": {"on": {"type": "boolean"}}}}}


@pytest.fixture(scope="module")
def free(tiny_llama_dir):
    """A random-weight model whose template knows nothing of tools: only the schema makes it
    call one."""
    with in_process_server(tiny_llama_dir, "free", max_num_seqs=8) as server:
        yield server.client


def assert_valid_call(name: str, arguments: dict) -> None:
    if name == "set_alarm":
        assert set(arguments) == {"hour", "mode"}
        assert isinstance(arguments["hour"], int) and 0 <= arguments["hour"] <= 23
        assert arguments["mode"] in ("once", "daily")
    else:
        assert name == "lights" and set(arguments) == {"on"}
        assert isinstance(arguments["on"], bool)


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_named_tool_choice_forces_that_call(free, seed):
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    ask = {"model": "free", "messages": ASK, "tools": [ALARM, LIGHTS], "max_tokens": 200,
           "tool_choice": {"type": "function", "function": {"name": "set_alarm"}}} | sampling
    r = free.chat.completions.create(**ask)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    [(name, arguments)] = calls_of(r.choices[0].message)
    assert name == "set_alarm"
    assert_valid_call(name, arguments)
    got = reassemble(free.chat.completions.create(**ask, stream=True))[0]
    assert got["finish"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
        ("set_alarm", r.choices[0].message.tool_calls[0].function.arguments)]


@pytest.mark.parametrize("seed", [None, 3, 4])
def test_required_tool_choice_forces_valid_calls(free, seed):
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    ask = {"model": "free", "messages": ASK, "tools": [ALARM, LIGHTS], "max_tokens": 300,
           "tool_choice": "required"} | sampling
    r = free.chat.completions.create(**ask)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = calls_of(r.choices[0].message)
    assert calls
    for name, arguments in calls:
        assert_valid_call(name, arguments)
    got = reassemble(free.chat.completions.create(**ask, stream=True))[0]
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
        (c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
    one = free.chat.completions.create(**ask, parallel_tool_calls=False)
    assert len(one.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("cut_in", ["name", "arguments"])
def test_a_required_call_cut_by_max_tokens_ends_with_length_and_never_shows_its_json(
        free, tiny_llama_dir, cut_in):
    """Cut before its name is whole, a required call is no call and no content; cut in its
    arguments, it is that call as far as it came (streamed or not, the same). The cuts are
    found in the uncut reply's tokens: where its "name" key ends, where its arguments open."""
    from transformers import AutoTokenizer

    ask = {"model": "free", "messages": ASK, "tools": [ALARM], "tool_choice": "required",
           "temperature": 0}
    whole = free.chat.completions.create(**ask, max_tokens=300,
                                         extra_body={"return_token_ids": True}).choices[0]
    assert whole.finish_reason == "tool_calls"
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    ids = whole.model_extra["token_ids"]
    marker = {"name": '"name"', "arguments": '"arguments": {'}[cut_in]
    cut = next(k for k in range(1, len(ids)) if marker in tokenizer.decode(ids[:k]))
    r = free.chat.completions.create(**ask, max_tokens=cut)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    if cut_in == "name":
        assert not message.content and message.tool_calls is None
    else:
        [call] = message.tool_calls
        assert message.content is None and call.function.name == "set_alarm"
        assert call.function.arguments.startswith("{")
        with pytest.raises(json.JSONDecodeError):
            json.loads(call.function.arguments)
    got = reassemble(free.chat.completions.create(**ask, max_tokens=cut, stream=True))[0]
    assert got["finish"] == "length" and got["content"] == (message.content or "")
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls or []]


# A pydantic model with a nested one, as openai.pydantic_function_tool writes it: the nested
# model is a local reference into $defs.
ROUTE = {"type": "function", "function": {"name": "route", "parameters": {
    "$defs": {"Place": {"type": "object", "properties": {"hour": {"type": "integer"}},
                        "required": ["hour"], "additionalProperties": False}},
    "type": "object", "properties": {"start": {"$ref": "#/$defs/Place"}},
    "required": ["start"], "additionalProperties": False}}}
# A recursive one: "#" is the function's own parameters.
CHAIN = {"type": "function", "function": {"name": "chain", "parameters": {
    "type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "required": ["next"], "additionalProperties": False}}}


@pytest.mark.parametrize("tools", [[ROUTE], [ROUTE, CHAIN, LIGHTS]], ids=["one", "several"])
def test_required_calls_follow_local_references_in_the_parameters(free, tools):
    """Each function's parameters sit inside the schema of the call array: a `$ref` left as
    written pointed at its root (a 400 for `#/$defs/...`, the array itself for `#`)."""
    for seed in (1, 2, 3):
        r = free.chat.completions.create(model="free", messages=ASK, tools=tools,
                                         tool_choice="required", max_tokens=300,
                                         temperature=1.0, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls"
        for name, arguments in calls_of(r.choices[0].message):
            if name == "route":
                assert set(arguments) == {"start"} and set(arguments["start"]) == {"hour"}
                assert isinstance(arguments["start"]["hour"], int)
            elif name == "chain":
                link = arguments
                while link is not None:
                    assert set(link) == {"next"}
                    link = link["next"]
            else:
                assert_valid_call(name, arguments)


def test_a_parameters_schema_the_grammar_cannot_enforce_is_400(free):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        free.chat.completions.create(model="free", messages=ASK, tools=[tool],
                                     tool_choice="required", max_tokens=5)
    error = err.value.response.json()["error"]
    assert error["param"] == "tools" and "not" in error["message"]


def test_references_are_rebased_by_where_they_sit_in_a_schema():
    """Names in $defs are names even when they read as keywords ("enum"); a value under enum
    is data; an anchor (#name) names no place and stays."""
    from tokenmill.engine.server.tools import required_schema

    parameters = {"$defs": {"enum": {"type": "object", "properties": {
        "x": {"$ref": "#/$defs/Y"}}}, "Y": {"type": "integer"}},
        "type": "object", "properties": {"a": {"$ref": "#/$defs/enum"},
                                         "b": {"enum": [{"$ref": "#/kept"}]},
                                         "c": {"$ref": "#anchor"}}}
    schema = required_schema([{"name": "f", "parameters": parameters}], None)
    rebased = schema["items"]["properties"]["arguments"]
    at = "#/items/properties/arguments"
    assert rebased["$defs"]["enum"]["properties"]["x"]["$ref"] == f"{at}/$defs/Y"
    assert rebased["properties"]["a"]["$ref"] == f"{at}/$defs/enum"
    assert rebased["properties"]["b"]["enum"] == [{"$ref": "#/kept"}]
    assert rebased["properties"]["c"]["$ref"] == "#anchor"
