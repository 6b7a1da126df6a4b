"""--reasoning-parser: a reasoning model's thinking apart from its answer, whole and streamed,
over real HTTP with the official client. The models are scripted (tool_support.py): greedy
decoding writes a known reply, in pieces that split the tags mid-way."""

from __future__ import annotations

import random

import httpx
import pytest
from server_support import in_process_server
from tool_support import make_scripted_model, streamed_reasoning

from tokenmill.engine.server.reasoning import REASONING_PARSERS, split_reasoning

TEMPLATE = """
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}\
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
THOUGHT = "Paris is the capital."
ANSWER = "It is Paris."
# Qwen3 writes <think> itself; DeepSeek-R1's template has opened it already.
REPLIES = {
    "qwen3": ["<thi", "nk>Paris is", " the capital.</", "think>\n\n", "It is Paris."],
    "deepseek_r1": ["Paris is", " the capital.</", "think>\n\n", "It is Paris."],
    # DeepSeek-V3.1 asked to think (chat_template_kwargs): as R1; MiniMax-M2 as R1 too.
    "deepseek_v3": ["Paris is", " the capital.</", "think>\n\n", "It is Paris."],
    "minimax_m2": ["Paris is", " the capital.</", "think>\n\n", "It is Paris."],
    "mistral": ["[TH", "INK]Paris is", " the capital.[/", "THINK]\n\n", "It is Paris."],
    # Granite says it in words, "Here is" or "Here's".
    "granite": ["Here is my thou", "ght process:Paris is", " the capital.Here's my resp",
                "onse:\n\n", "It is Paris."],
    # GLM-4.5 writes the tags as Qwen3 does.
    "glm45": ["<think>Paris", " is the capital.</think>", "\n", "It is Paris."],
    # GPT-OSS's harmony channels (its markers are special tokens: test_harmony.py).
    "openai_gptoss": ["<|channel|>analysis<|message|>", "Paris is", " the capital.<|end|>",
                      "<|start|>assistant<|channel|>final<|message|>", "It is Paris."],
}
QWEN3, DEEPSEEK = REASONING_PARSERS["qwen3"], REASONING_PARSERS["deepseek_r1"]
ASK = [{"role": "user", "content": "What is the capital of France?"}]


# MiniMax-M2's append-think "parser" splits nothing (test below).
SPLITTING = sorted(set(REASONING_PARSERS) - {"minimax_m2_append_think"})


@pytest.mark.parametrize("parser", SPLITTING)
def test_a_streamed_split_joins_to_the_whole_replys(parser):
    """Cut anywhere, the streamed reasoning pieces join to the whole reply's reasoning and the
    answer so far only ever grows: nothing sent is taken back."""
    text = "".join(REPLIES[parser])
    inside = REASONING_PARSERS[parser]
    assert inside.split(text) == (THOUGHT, ANSWER)
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 8))) + [len(text)]
        sent, answer = "", ""
        for cut in cuts:
            thought, now = inside.split(text[:cut], final=cut == len(text))
            thought = thought or ""
            assert thought.startswith(sent[:len(thought)]) and len(thought) >= len(sent)
            assert now.startswith(answer)
            sent, answer = thought, now
        assert (sent, answer) == (THOUGHT, ANSWER)


def test_replies_that_do_not_think():
    assert split_reasoning("Just an answer.", QWEN3) == (None, "Just an answer.")
    assert split_reasoning("<th", QWEN3, final=False) == (None, "")
    assert split_reasoning("<th", QWEN3) == (None, "<th")
    assert split_reasoning("<think>not Magistral's", REASONING_PARSERS["mistral"]) == (
        None, "<think>not Magistral's")
    granite = REASONING_PARSERS["granite"]
    assert split_reasoning("Here is the answer.", granite) == (None, "Here is the answer.")
    assert split_reasoning("Here", granite, final=False) == (None, "")
    assert split_reasoning("Here's my thought process: hm. Here", granite, final=False) == (
        " hm. ", "")
    # Cut off while thinking: all reasoning, no answer.
    assert split_reasoning("<think>Hmm, let", QWEN3) == ("Hmm, let", "")
    assert split_reasoning("Hmm, let me</thi", DEEPSEEK, final=False) == (
        "Hmm, let me", "")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, smol_tokenizer):
    """A model that thinks as Qwen3 does (deepseek_r1's split is the same past the opening
    tag: the unit tests above cover both)."""
    parser = "qwen3"
    directory = make_scripted_model(str(tmp_path_factory.mktemp(parser)), smol_tokenizer,
                                    TEMPLATE, REPLIES[parser])
    with in_process_server(directory, "thinker", options={"reasoning_parser": parser},
                           max_num_seqs=4) as server:
        yield server


def test_the_message_holds_the_thinking_apart(thinker):
    reply = thinker.client.chat.completions.create(model="thinker", messages=ASK,
                                                   max_tokens=20, temperature=0)
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert message.model_extra["reasoning"] == THOUGHT == message.model_extra["reasoning_content"]
    assert reply.choices[0].finish_reason == "stop"


def test_include_reasoning_false_leaves_the_thinking_out(thinker):
    """vLLM's include_reasoning: the answer alone, whole or streamed."""
    reply = thinker.client.chat.completions.create(
        model="thinker", messages=ASK, max_tokens=20, temperature=0,
        extra_body={"include_reasoning": False})
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert "reasoning" not in message.model_extra
    assert "reasoning_content" not in message.model_extra
    stream = thinker.client.chat.completions.create(
        model="thinker", messages=ASK, max_tokens=20, temperature=0, stream=True,
        extra_body={"include_reasoning": False})
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert "".join(d.content or "" for d in deltas) == ANSWER
    assert not any((d.model_extra or {}).get("reasoning") for d in deltas)


def test_streamed_deltas_join_to_the_message(thinker):
    assert streamed_reasoning(thinker.client, "thinker", ASK) == (THOUGHT, ANSWER)


def test_earlier_thinking_sent_back_reaches_the_template(thinker):
    """vLLM's `reasoning` (or the older `reasoning_content`) on an earlier assistant turn is
    the template's `reasoning_content`, as Qwen3's template reads it."""
    for key in ("reasoning", "reasoning_content"):
        turns = ASK + [{"role": "assistant", "content": ANSWER, key: THOUGHT},
                       {"role": "user", "content": "Sure?"}]
        ids = httpx.post(f"{thinker.url}/tokenize", json={"messages": turns}).json()
        text = thinker.state.tokenizer.decode(ids["tokens"])
        assert f"<think>{THOUGHT}</think>{ANSWER}" in text


def test_deepseek_v3_thinks_only_where_the_request_asks(tmp_path, smol_tokenizer):
    """DeepSeek-V3.1's parser splits the reply where chat_template_kwargs turn thinking on
    (`thinking`, or `enable_thinking`); elsewhere the whole reply is the answer, as the
    template then closes the thinking in the prompt."""
    reply = REPLIES["deepseek_v3"]
    directory = make_scripted_model(str(tmp_path / "v31"), smol_tokenizer, TEMPLATE, reply)
    with in_process_server(directory, "v31", options={"reasoning_parser": "deepseek_v3"},
                           max_num_seqs=4) as server:
        def ask(kwargs: dict | None):
            extra = {} if kwargs is None else {"chat_template_kwargs": kwargs}
            message = server.client.chat.completions.create(
                model="v31", messages=ASK, max_tokens=20, temperature=0,
                extra_body=extra).choices[0].message
            return message.model_extra.get("reasoning"), message.content

        assert ask({"thinking": True}) == (THOUGHT, ANSWER)
        assert ask({"enable_thinking": True}) == (THOUGHT, ANSWER)
        assert ask(None) == (None, "".join(reply))
        assert ask({"thinking": False}) == (None, "".join(reply))
        streamed = streamed_reasoning(server.client, "v31", ASK,
                                      extra_body={"chat_template_kwargs": {"thinking": True}})
        assert streamed == (THOUGHT, ANSWER)


def test_minimax_m2_append_think_puts_the_opened_tag_back_in_the_answer():
    """vLLM's minimax_m2_append_think: no reasoning field; the answer is the whole reply after
    the `<think>` the prompt opened, streamed as it grows."""
    appending = REASONING_PARSERS["minimax_m2_append_think"]
    text = "".join(REPLIES["minimax_m2"])
    assert appending.split(text) == (None, "<think>" + text)
    sent = ""
    for cut in range(len(text) + 1):
        thought, answer = appending.split(text[:cut], final=cut == len(text))
        assert thought is None and answer.startswith(sent)
        sent = answer
    assert sent == "<think>" + text


def test_the_flag_offers_exactly_the_parsers_there_are():
    from tokenmill.engine.contract.server_flags import REASONING_PARSER_NAMES

    assert sorted(REASONING_PARSER_NAMES) == sorted(REASONING_PARSERS)
