"""GPT-OSS's harmony replies (--reasoning-parser openai_gptoss, --tool-call-parser openai):
the analysis channel is the reasoning, the final channel the answer, messages to
functions.NAME the tool calls; whole and streamed in every split, the streamed pieces join to
the whole; and over HTTP, a scripted model's harmony reply (its markers special tokens) comes
back split, so the server decodes such replies with their special tokens."""

from __future__ import annotations

import pytest
from server_support import in_process_server
from tool_support import (
    assert_stream_matches,
    make_scripted_model,
    splits,
    streamed,
    streamed_reasoning,
)

from tokenmill.engine.server.harmony import parse_messages
from tokenmill.engine.server.reasoning import REASONING_PARSERS
from tokenmill.engine.server.tool_parsers import OpenAIToolParser

HARMONY = REASONING_PARSERS["openai_gptoss"]
THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city": "Paris"}')
ANSWER = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."


def test_messages_are_read_by_channel_and_recipient():
    messages = parse_messages(THINK + CALL + "<|call|>")
    assert [(m.channel, m.recipient, m.content) for m in messages] == [
        ("analysis", None, "The user wants the weather."),
        ("commentary", "functions.get_weather", '{"city": "Paris"}')]
    # The recipient may come in the role's part of the header instead.
    other = parse_messages('<|start|>assistant to=functions.f<|channel|>commentary json'
                           '<|message|>{}<|call|>')
    assert [(m.channel, m.recipient) for m in other] == [("commentary", "functions.f")]


def test_the_reasoning_is_the_analysis_and_the_answer_the_final_channel():
    assert HARMONY.split(THINK + ANSWER) == ("The user wants the weather.",
                                            "It is sunny in Paris.")
    assert HARMONY.split("Just text.") == (None, "Just text.")
    # Cut off while thinking: all reasoning; a header not yet finished says nothing.
    assert HARMONY.split("<|channel|>analysis<|message|>Hmm") == ("Hmm", "")
    assert HARMONY.split(THINK + "<|start|>assistant<|channel|>fin", final=False) == (
        "The user wants the weather.", "")
    # A tool call stays in the answer, in harmony, for the tool-call parser.
    thought, answer = HARMONY.split(THINK + CALL)
    assert thought == "The user wants the weather."
    assert OpenAIToolParser().parse(answer, final=True).calls[0].arguments == '{"city": "Paris"}'


def test_streamed_reasoning_and_answer_only_grow():
    text = THINK + ANSWER
    for pieces in splits(text):
        sent, answer, seen = "", "", ""
        for piece in pieces:
            seen += piece
            thought, now = HARMONY.split(seen, final=seen == text)
            thought = thought or ""
            assert thought.startswith(sent) and now.startswith(answer)
            sent, answer = thought, now
        assert (sent, answer) == ("The user wants the weather.", "It is sunny in Paris.")


@pytest.mark.parametrize("text", [THINK + CALL, THINK + CALL + "<|call|>", CALL, ANSWER,
                                  THINK + ANSWER, "Plain text, no channels."])
def test_tool_calls_whole_and_streamed(text):
    content, calls = assert_stream_matches(OpenAIToolParser(), text)
    if "to=functions" in text:
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("get_weather", '{"city": "Paris"}')]
        assert content is None
    else:
        assert calls == []
        assert content == ("Plain text, no channels." if "Plain" in text
                           else "It is sunny in Paris.")


def test_streamed_arguments_grow_with_the_message():
    text = CALL[:CALL.index("{")] + '{"a": "' + "x" * 40 + '"}'
    _, calls, deltas = streamed(OpenAIToolParser(), list(text))
    assert len(deltas) > 10
    assert calls[0]["arguments"] == '{"a": "' + "x" * 40 + '"}'


TEMPLATE = """
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.thinking %}[analysis]{{ message.thinking }}[/analysis]{% endif %}\
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
# A harmony reply in pieces; the pieces that hold markers are special tokens, as in GPT-OSS's
# tokenizer (each piece must be a new token of its own, so the two headers are one each).
REPLY = ["<|channel|>analysis<|message|>", "Paris is", " the capital.",
         "<|end|><|start|>assistant<|channel|>final<|message|>", "It is Paris."]


@pytest.fixture(scope="module")
def gpt_oss_like(tmp_path_factory, smol_tokenizer):
    directory = make_scripted_model(str(tmp_path_factory.mktemp("harmony")), smol_tokenizer,
                                    TEMPLATE, REPLY, special=(REPLY[0], REPLY[3]))
    with in_process_server(directory, "gpt-oss",
                           options={"reasoning_parser": "openai_gptoss"}) as server:
        yield server


def test_a_harmony_reply_comes_back_split(gpt_oss_like):
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    reply = gpt_oss_like.client.chat.completions.create(model="gpt-oss", messages=ask,
                                                        max_tokens=20, temperature=0)
    message = reply.choices[0].message
    assert (message.model_extra["reasoning"], message.content) == (
        "Paris is the capital.", "It is Paris.")
    assert streamed_reasoning(gpt_oss_like.client, "gpt-oss", ask) == (
        "Paris is the capital.", "It is Paris.")


def test_a_preamble_before_a_call_stays_content():
    preamble = "<|channel|>commentary<|message|>Let me check.<|end|>"
    thought, answer = HARMONY.split(THINK + preamble + CALL)
    assert thought == "The user wants the weather."
    content, calls = assert_stream_matches(OpenAIToolParser(), answer)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    # Without the reasoning parser the tool-call parser reads the raw reply the same way.
    raw_content, raw_calls = assert_stream_matches(OpenAIToolParser(), THINK + preamble + CALL)
    assert raw_content == content
    assert [c["function"] for c in raw_calls] == [c["function"] for c in calls]


def test_an_earlier_turns_reasoning_reaches_the_template_as_thinking(gpt_oss_like):
    """GPT-OSS's template shows an earlier turn's analysis (before its tool call) from the
    message's `thinking`; vLLM's clients send it back as `reasoning`."""
    import httpx

    turns = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": "", "reasoning": "Need the weather."},
             {"role": "user", "content": "Go on."}]
    ids = httpx.post(f"{gpt_oss_like.url}/tokenize", json={"messages": turns}).json()
    assert "[analysis]Need the weather.[/analysis]" in \
        gpt_oss_like.state.tokenizer.decode(ids["tokens"])


CALL_REPLY = ["<|channel|>analysis<|message|>", "Need the weather.",
              "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
              "<|constrain|>json<|message|>", '{"city": ', '"Paris"}']
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def gpt_oss_caller(tmp_path_factory, smol_tokenizer):
    directory = make_scripted_model(str(tmp_path_factory.mktemp("harmony-call")),
                                    smol_tokenizer, TEMPLATE, CALL_REPLY,
                                    special=(CALL_REPLY[0], CALL_REPLY[2]))
    options = {"reasoning_parser": "openai_gptoss", "tool_call_parser": "openai",
               "enable_auto_tool_choice": True}
    with in_process_server(directory, "gpt-oss", options=options) as server:
        yield server


def test_a_harmony_call_comes_back_as_a_tool_call(gpt_oss_caller):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    reply = gpt_oss_caller.client.chat.completions.create(
        model="gpt-oss", messages=ask, tools=WEATHER, max_tokens=20, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning"] == "Need the weather."
    assert choice.message.content is None
    call = choice.message.tool_calls[0].function
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    names, arguments = [], ""
    for piece in gpt_oss_caller.client.chat.completions.create(
            model="gpt-oss", messages=ask, tools=WEATHER, max_tokens=20, temperature=0,
            stream=True):
        for delta in piece.choices[0].delta.tool_calls or []:
            names += [delta.function.name] if delta.function.name else []
            arguments += delta.function.arguments or ""
    assert (names, arguments) == (["get_weather"], '{"city": "Paris"}')
