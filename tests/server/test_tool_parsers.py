"""Tool-call parsers: whole replies, and the same replies streamed in every possible split."""

from __future__ import annotations

import json

import pytest
from tool_support import assert_stream_matches, splits, streamed

from tokenmill.engine.server.tool_parsers import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    Glm45ToolParser,
    GraniteToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    MiniMaxM2ToolParser,
    MistralToolParser,
    NamedToolParser,
    Phi4MiniJsonToolParser,
    PythonicToolParser,
    Qwen3CoderToolParser,
    RequiredToolParser,
    ToolCallStream,
    tool_call_message,
)

HERMES_TWO_CALLS = (
    'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": 3}}\n</tool_call>\n<tool_call>\n{"arguments": {"zone": "CET"}, "name": "get_time"}'
    "\n</tool_call>"
)


def test_hermes_content_and_two_calls():
    content, calls = assert_stream_matches(HermesToolParser(), HERMES_TWO_CALLS)
    assert content == "Let me check both.\n"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris", "days": 3}, {"zone": "CET"}]
    assert len({c["id"] for c in calls}) == 2


def test_hermes_streaming_never_sends_the_tag_as_content():
    for pieces in splits(HERMES_TWO_CALLS, seed=1):
        content, _, deltas = streamed(HermesToolParser(), pieces)
        assert "<" not in content
        assert deltas[0]["function"]["name"] == "get_weather"


def test_hermes_plain_text_passes_through_even_when_it_looks_like_a_tag():
    for text in ["The answer is 4 < 5.", "ends with <tool", "a <tool_cal> b", "<tool_call"]:
        content, calls = assert_stream_matches(HermesToolParser(), text)
        assert (content, calls) == (text, [])


def test_hermes_block_without_a_function_name_is_content():
    for text in ["<tool_call>\nnot json\n</tool_call>",
                 '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
                 '<tool_call>{"arguments": {"a": 1}}</tool_call>',
                 '<tool_call>{"nam']:
        assert assert_stream_matches(HermesToolParser(), text) == (text, [])


def test_a_named_call_stays_a_call_when_what_follows_goes_wrong():
    """Streaming sends a call once its name is complete; the whole reply says the same."""
    for text, arguments in [
            ('<tool_call>{"name": "f", "arguments": {"a": 1}} junk</tool_call>', '{"a": 1}'),
            ('<tool_call>{"name": "f", "arguments": {"a": [1, 2', '{"a": [1, 2'),  # max_tokens
            ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><tool_call>{"x', None),
    ]:
        _, calls = assert_stream_matches(HermesToolParser(), text)
        assert [c["function"]["name"] for c in calls] == ["f"]
        assert calls[0]["function"]["arguments"] == (arguments or '{"a": 1}')


def test_hermes_strings_with_braces_quotes_and_escapes():
    args = {"q": 'say "}" then {', "path": "C:\\dir", "nested": {"list": [1, {"x": None}]}}
    text = f'<tool_call>{{"name": "search", "arguments": {json.dumps(args)}}}</tool_call>'
    content, calls = assert_stream_matches(HermesToolParser(), text)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == args


def test_a_call_without_arguments_gets_an_empty_object():
    content, calls = assert_stream_matches(HermesToolParser(),
                                           '<tool_call>{"name": "now"}</tool_call>')
    assert calls[0]["function"] == {"name": "now", "arguments": "{}"}


def test_hermes_without_closing_tag_at_the_end_is_still_a_call():
    _, calls = assert_stream_matches(HermesToolParser(),
                                     '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')
    assert calls[0]["function"]["arguments"] == '{"a": 1}'


def test_llama3_json_with_python_tag_and_two_calls():
    text = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "get_time", "parameters": {"zone": "CET"}}')
    content, calls = assert_stream_matches(Llama3JsonToolParser(), text)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]


def test_llama3_json_plain_answers_and_other_json_are_content():
    for text in ["Paris is the capital.", '{"answer": 42}', "<|python", "  ", '{"na']:
        content, calls = assert_stream_matches(Llama3JsonToolParser(), text)
        assert (content, calls) == (text, [])


def test_llama3_json_holds_back_a_reply_until_it_is_clear():
    stream = ToolCallStream(Llama3JsonToolParser())
    assert stream.update("<|py", final=False) == ("", [])
    assert stream.update('{"na', final=False) == ("", [])
    assert stream.update('{"answer": 4', final=False) == ("", [])
    assert stream.update('{"answer": 42}', final=True) == ('{"answer": 42}', [])
    plain = ToolCallStream(Llama3JsonToolParser())
    assert plain.update("Hi", final=False) == ("Hi", [])


MISTRAL_ARRAY = ('Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": '
                 '"Paris"}}, {"name": "get_time", "arguments": {}}]')
MISTRAL_V11 = ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "note": "a [b] {c}"}'
               '[TOOL_CALLS]get_time[ARGS]{}')


@pytest.mark.parametrize("text", [MISTRAL_ARRAY, MISTRAL_V11])
def test_mistral_calls_in_both_formats(text):
    content, calls = assert_stream_matches(MistralToolParser(), text)
    assert content == ("Checking. " if text is MISTRAL_ARRAY else None)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"} if text is MISTRAL_ARRAY
         else {"city": "Paris", "note": "a [b] {c}"}), ("get_time", {})]


def test_mistral_plain_text_and_a_cut_call():
    assert assert_stream_matches(MistralToolParser(), "No tools [needed] here.") == (
        "No tools [needed] here.", [])
    _, streamed_deltas = ToolCallStream(MistralToolParser()).update("[TOOL_CA", final=False)
    assert streamed_deltas == []
    content, calls = tool_call_message(MistralToolParser(), '[TOOL_CALLS]f[ARGS]{"a": ')
    assert content is None and calls[0]["function"] == {"name": "f", "arguments": '{"a": '}


PYTHONIC_TWO_CALLS = ("[get_weather(city='San Francisco', days=3, units=\"metric\"), "
                      "get_time(), search(query='a (b), [c]', tags=['x', 'y'], exact=True)]")


def test_pythonic_calls_become_json_arguments():
    content, calls = assert_stream_matches(PythonicToolParser(), PYTHONIC_TWO_CALLS)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "San Francisco", "days": 3, "units": "metric"}),
        ("get_time", {}),
        ("search", {"query": "a (b), [c]", "tags": ["x", "y"], "exact": True})]


@pytest.mark.parametrize("text", ["The answer is 4.", "[1, 2, 3]", "[a, b]", "[]",
                                  "[see note](http://x)"])
def test_pythonic_other_replies_are_content(text):
    assert assert_stream_matches(PythonicToolParser(), text) == (text, [])


def test_pythonic_arguments_that_are_not_literals_leave_the_call_empty():
    content, calls = tool_call_message(PythonicToolParser(), "[f(x=os.getcwd())]")
    assert content is None and calls[0]["function"] == {"name": "f", "arguments": ""}


GRANITE_TWO_CALLS = ('<|tool_call|>[{"arguments": {"city": "Paris"}, "name": "get_weather"}, '
                     '{"name": "get_time", "arguments": {}}]')


@pytest.mark.parametrize("text", [GRANITE_TWO_CALLS, GRANITE_TWO_CALLS.replace(
    "<|tool_call|>", " <tool_call>\n")])
def test_granite_calls_after_either_tag(text):
    content, calls = assert_stream_matches(GraniteToolParser(), text)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]


@pytest.mark.parametrize("text", ["It is sunny.", "<b>bold</b>", "<|tool_call|> no list",
                                  "<tool", "Call <|tool_call|>[] later"])
def test_granite_other_replies_are_content(text):
    assert assert_stream_matches(GraniteToolParser(), text) == (text, [])


def test_granite_holds_back_what_may_become_the_tag():
    stream = ToolCallStream(GraniteToolParser())
    assert stream.update("<|tool", final=False) == ("", [])
    assert stream.update("<|tool_call|>[", final=False) == ("", [])


PHI4_MINI = ('Let me look that up. functools[{"name": "get_weather", "arguments": '
             '{"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]')


def test_phi4_mini_content_then_calls():
    content, calls = assert_stream_matches(Phi4MiniJsonToolParser(), PHI4_MINI)
    assert content == "Let me look that up. "
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]


@pytest.mark.parametrize("text", ["No tools needed.", "functools are in the stdlib",
                                  "functools[not json]"])
def test_phi4_mini_other_replies_are_content(text):
    assert assert_stream_matches(Phi4MiniJsonToolParser(), text) == (text, [])


def test_required_choice_array():
    text = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    content, calls = assert_stream_matches(RequiredToolParser(), text)
    assert content is None and [c["function"]["name"] for c in calls] == ["a", "b"]


@pytest.mark.parametrize("text", ["[", '[{"na', '[{"name": "set_al'])
def test_a_required_choice_cut_before_its_first_name_is_neither_content_nor_a_call(text):
    assert assert_stream_matches(RequiredToolParser(), text) == ("", [])


def test_a_required_choice_cut_in_its_arguments_is_that_call_as_far_as_it_came():
    text = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [2, '
    content, calls = assert_stream_matches(RequiredToolParser(), text)
    assert content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("a", '{"x": 1}'), ("b", '{"y": [2, ')]


def test_named_choice_is_the_arguments_object():
    content, calls = assert_stream_matches(NamedToolParser("f"), ' {"x": [1, 2]}')
    assert content is None and calls[0]["function"] == {"name": "f", "arguments": '{"x": [1, 2]}'}
    # The name goes out before any argument text: the function is known from the start.
    stream = ToolCallStream(NamedToolParser("f"))
    assert stream.update("", final=False)[1][0]["function"] == {"name": "f", "arguments": ""}


def test_max_calls_keeps_the_first_call():
    content, calls = tool_call_message(HermesToolParser(), HERMES_TWO_CALLS, max_calls=1)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    stream = ToolCallStream(HermesToolParser(), max_calls=1)
    _, deltas = stream.update(HERMES_TWO_CALLS, final=True)
    assert [d["function"]["name"] for d in deltas] == ["get_weather"]


@pytest.mark.parametrize("parser", [HermesToolParser(), Llama3JsonToolParser(),
                                    MistralToolParser(), GraniteToolParser(),
                                    Phi4MiniJsonToolParser(), DeepSeekV3ToolParser(),
                                    DeepSeekV31ToolParser()])
def test_streamed_arguments_only_grow(parser):
    text = {HermesToolParser: '<tool_call>{"name": "f", "arguments": {"a": "' + "x" * 50
                              + '"}}</tool_call>',
            Llama3JsonToolParser: '{"name": "f", "parameters": {"a": "' + "x" * 50 + '"}}',
            MistralToolParser: '[TOOL_CALLS]f[ARGS]{"a": "' + "x" * 50 + '"}',
            GraniteToolParser: '<|tool_call|>[{"name": "f", "arguments": {"a": "' + "x" * 50
                               + '"}}]',
            Phi4MiniJsonToolParser: 'functools[{"name": "f", "arguments": {"a": "' + "x" * 50
                                    + '"}}]',
            DeepSeekV3ToolParser: f"{DS_CALLS}{DS_CALL}function{DS_SEP}f\n```json\n"
                                  + '{"a": "' + "x" * 50 + f'"}}\n```{DS_CALL_END}{DS_END}',
            DeepSeekV31ToolParser: f"{DS_CALLS}{DS_CALL}f{DS_SEP}" + '{"a": "' + "x" * 50
                                   + f'"}}{DS_CALL_END}{DS_END}'}[type(parser)]
    _, calls, deltas = streamed(parser, list(text))
    assert len(deltas) > 10  # arguments stream as they are generated, not at the end
    assert calls[0]["arguments"] == '{"a": "' + "x" * 50 + '"}'


def test_the_flag_offers_exactly_the_parsers_there_are():
    """--tool-call-parser's choices live in the torch-free contract (the operator checks
    extraArgs with them); they must name the server's parsers, no more, no fewer."""
    from tokenmill.engine.contract.server_flags import TOOL_CALL_PARSER_NAMES
    from tokenmill.engine.server.tool_parsers import TOOL_CALL_PARSERS

    assert sorted(TOOL_CALL_PARSER_NAMES) == sorted(TOOL_CALL_PARSERS)


DS_CALLS, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_V3_TWO_CALLS = (
    f"Checking both.{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n"
    f'{{"city": "Paris", "days": 3}}\n```{DS_CALL_END}\n{DS_CALL}function{DS_SEP}get_time\n'
    f"```json\n{{}}\n```{DS_CALL_END}{DS_END}")
DEEPSEEK_V31_TWO_CALLS = (
    f'Checking both.{DS_CALLS}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris", "days": 3}}'
    f"{DS_CALL_END}{DS_CALL}get_time{DS_SEP}{{}}{DS_CALL_END}{DS_END}")


@pytest.mark.parametrize(("parser", "text"), [
    (DeepSeekV3ToolParser(), DEEPSEEK_V3_TWO_CALLS),
    (DeepSeekV31ToolParser(), DEEPSEEK_V31_TWO_CALLS)])
def test_deepseek_calls_in_both_formats(parser, text):
    """Streamed in every split, the same content and calls as the whole reply."""
    content, calls = assert_stream_matches(parser, text)
    assert content == "Checking both."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]


@pytest.mark.parametrize("parser", [DeepSeekV3ToolParser(), DeepSeekV31ToolParser()])
@pytest.mark.parametrize("text", ["It is sunny.", "a <｜tool▁calls", "```json\n{}\n```"])
def test_deepseek_other_replies_are_content(parser, text):
    assert assert_stream_matches(parser, text) == (text, [])


def test_deepseek_v3_call_cut_short_keeps_its_name_and_arguments_so_far():
    """A reply cut by max_tokens inside the arguments is still that call (its arguments as
    far as written, the fence left out)."""
    text = f'{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Pa'
    content, calls = tool_call_message(DeepSeekV3ToolParser(), text)
    assert content is None
    assert calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["arguments"] == '{"city": "Pa'


QWEN3_CODER_TWO_CALLS = (
    "Checking both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n"
    "<parameter=units>\n{\"temp\": \"C\"}\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_time>\n</function>\n</tool_call>")
WEATHER = {"get_weather": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
    "units": {"type": "object"}}}}}


MINIMAX_M2_TWO_CALLS = (
    "Checking both.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
    "<parameter name=\"city\">New York</parameter>\n<parameter name=\"days\">3</parameter>\n"
    "<parameter name=\"zip\">10001</parameter>\n"
    "<parameter name=\"units\">{\"temp\": \"C\"}</parameter>\n</invoke>\n"
    "<invoke name=\"get_time\">\n</invoke>\n</minimax:tool_call>")
# The formats that type each argument by the request's schema, and a reply in each.
SCHEMA_TYPED = [(Qwen3CoderToolParser, QWEN3_CODER_TWO_CALLS),
                (MiniMaxM2ToolParser, MINIMAX_M2_TWO_CALLS)]


@pytest.mark.parametrize(("parser", "text"), SCHEMA_TYPED)
def test_schema_typed_values_take_their_schemas_types(parser, text):
    """"10001" is a string where the schema says so, 3 an integer; streamed in every split,
    the same content and calls as the whole reply (MiniMax-M2's: two invokes in one
    tool_call block)."""
    content, calls = assert_stream_matches(parser(WEATHER), text)
    assert content == "Checking both.\n"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "New York", "days": 3, "zip": "10001", "units": {"temp": "C"}}),
        ("get_time", {})]


@pytest.mark.parametrize(("parser", "text"), SCHEMA_TYPED)
def test_schema_typed_arguments_grow_a_parameter_at_a_time(parser, text):
    _, calls, deltas = streamed(parser(WEATHER), list(text))
    first = [d["function"]["arguments"] for d in deltas if d["index"] == 0]
    assert first == ["{", '"city": "New York"', ', "days": 3', ', "zip": "10001"',
                     ', "units": {"temp": "C"}', "}"]
    assert calls[1]["arguments"] == "{}"


def test_qwen3_coder_without_a_schema_reads_json_where_it_parses():
    _, calls = tool_call_message(Qwen3CoderToolParser(), QWEN3_CODER_TWO_CALLS)
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "city": "New York", "days": 3, "zip": 10001, "units": {"temp": "C"}}


@pytest.mark.parametrize(("parser", "text"), [
    (Qwen3CoderToolParser, "It is sunny."), (Qwen3CoderToolParser, "a <tool_call"),
    (Qwen3CoderToolParser, "<function=x>"), (MiniMaxM2ToolParser, "It is sunny."),
    (MiniMaxM2ToolParser, "a <minimax:tool"), (MiniMaxM2ToolParser, "<invoke name=\"x\">")])
def test_schema_typed_formats_other_replies_are_content(parser, text):
    assert assert_stream_matches(parser(), text) == (text, [])


GLM45_TWO_CALLS = (
    "Checking both.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
    "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    "<tool_call>get_time\n</tool_call>")


def test_glm45_calls_with_string_and_json_values():
    content, calls = assert_stream_matches(Glm45ToolParser(), GLM45_TWO_CALLS)
    assert content == "Checking both."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]


@pytest.mark.parametrize("text", ["It is sunny.", "a <tool_call", "<tool_call>"])
def test_glm45_other_replies_are_content(text):
    assert assert_stream_matches(Glm45ToolParser(), text) == (text, [])


def test_glm45_arguments_grow_a_pair_at_a_time():
    _, calls, deltas = streamed(Glm45ToolParser(), list(GLM45_TWO_CALLS))
    first = [d["function"]["arguments"] for d in deltas if d["index"] == 0]
    assert first == ["{", '"city": "Paris"', ', "days": 3', "}"]
    assert calls[1]["arguments"] == "{}"
