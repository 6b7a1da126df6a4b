"""Structured outputs and logit_bias over HTTP, through the official `openai` client: OpenAI's
response_format, vLLM's structured_outputs and guided_* fields, on both endpoints."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest
from model_support import SMOLLM2
from server_support import async_openai_client
from structured_support import ASK, PERSON

pytest.importorskip("xgrammar")

MODEL = SMOLLM2  # what the `server` fixture serves
PERSON_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def test_json_schema_replies_always_validate_100_seeded_samples_at_temperature_1(base_url):
    """100 samples: 10 concurrent requests of n=10, seeds 0..9; the engine batches them."""
    async def ask_all():
        async with async_openai_client(f"{base_url}/v1", timeout=600) as client:
            return await asyncio.gather(*[
                client.chat.completions.create(model=MODEL, messages=ASK, n=10, seed=seed,
                                               temperature=1.0, max_tokens=96,
                                               response_format=PERSON_FORMAT)
                for seed in range(10)])

    replies = asyncio.run(ask_all())
    choices = [c for r in replies for c in r.choices]
    assert len(choices) == 100
    people = []
    for choice in choices:
        assert choice.finish_reason == "stop", choice.message.content
        person = json.loads(choice.message.content)
        jsonschema.validate(person, PERSON)
        people.append(json.dumps(person, sort_keys=True))
    assert len(set(people)) >= 50  # sampled, not one answer a hundred times


def test_streamed_json_schema_reply_joins_to_valid_json(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=96, stream=True,
        response_format=PERSON_FORMAT))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_json_object_reply_parses_as_an_object(client):
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=120, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with a JSON object whose "city" is Paris '
                                              'and whose "country" is France.'}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    text = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                          max_tokens=8, response_format={"type": "text"})
    assert text.choices[0].finish_reason == "length"  # text: no constraint


def test_a_structural_tag_through_each_field_name(client):
    """vLLM's structural tags over HTTP: response_format {"type": "structural_tag"} and the
    structural_tag field, in xgrammar's format form; the reply is the tag around the JSON."""
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "tag", "begin": "<answer>", "end": "</answer>",
           "content": {"type": "json_schema", "json_schema": city}}
    ask = [{"role": "user", "content": "What is the capital of France? Reply with JSON."}]
    for extra in ({"response_format": {"type": "structural_tag", "format": fmt}},
                  {"structural_tag": json.dumps({"type": "structural_tag", "format": fmt})},
                  {"structured_outputs": {"structural_tag": {"type": "structural_tag",
                                                             "format": fmt}}}):
        r = client.chat.completions.create(model=MODEL, messages=ask, temperature=0,
                                           max_tokens=40, extra_body=extra)
        body = re.fullmatch(r"<answer>(.*)</answer>", r.choices[0].message.content, re.DOTALL)
        assert body and r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(body[1]), city)


def test_json_schema_on_completions_through_each_field_name(client):
    prompt = "A person, as JSON:"
    for extra in ({"response_format": PERSON_FORMAT}, {"guided_json": PERSON},
                  {"structured_outputs": {"json": PERSON}}):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=96,
                                      temperature=0.8, seed=4, extra_body=extra)
        jsonschema.validate(json.loads(r.choices[0].text), PERSON)


@pytest.mark.parametrize("field", ["guided_regex", "structured_outputs"])
def test_regex_replies_match_in_full(client, field):
    pattern = r"(Mon|Tue|Wed)day at \d{1,2}(am|pm)"
    value = pattern if field == "guided_regex" else {"regex": pattern}
    r = client.completions.create(model=MODEL, prompt="When shall we meet?", n=4,
                                  temperature=1.0, seed=7, max_tokens=16,
                                  extra_body={field: value})
    for choice in r.choices:
        assert re.fullmatch(pattern, choice.text), choice.text
        assert choice.finish_reason == "stop"


def test_choice_replies_are_one_of_the_choices(client):
    choices = ["positive", "negative", "neutral"]
    r = client.chat.completions.create(
        model=MODEL, n=8, temperature=1.0, seed=1, max_tokens=8,
        messages=[{"role": "user", "content": "Sentiment of 'I love this film'?"}],
        extra_body={"guided_choice": choices})
    assert {c.message.content for c in r.choices} <= set(choices)
    r = client.completions.create(model=MODEL, prompt="Pick one:", max_tokens=8, temperature=0,
                                  extra_body={"structured_outputs": {"choice": ["x y", "z"]}})
    assert r.choices[0].text in ("x y", "z")


def test_grammar_replies_follow_it(client):
    grammar = 'root ::= "id-" [0-9] [0-9] [0-9]'
    r = client.completions.create(model=MODEL, prompt="An id:", max_tokens=8, temperature=1.0,
                                  seed=2, extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"id-\d{3}", r.choices[0].text)


@pytest.mark.parametrize("extra, param, says", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "tags", "schema": {"type": "array", "items": {"type": "string"},
                                   "uniqueItems": True}}}},
     "response_format", "unsupported JSON Schema features: 'uniqueItems' at /"),
    ({"guided_json": {"type": "object", "properties": {"a": {"not": {"type": "null"}}}}},
     "guided_json", "'not' (negation) at /properties/a"),
    ({"structured_outputs": {"json": {"type": "string", "format": "idn-email"}}},
     "structured_outputs", "'format': 'idn-email'"),
    ({"guided_regex": "(unclosed"}, "guided_regex", "the regex does not compile"),
    ({"guided_grammar": "root ::= nothing"}, "guided_grammar", "the grammar does not compile"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "needs json_schema.schema"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one of"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs",
     "the structural tag is not valid JSON"),
    ({"structural_tag": {"triggers": ["<f>"]}}, "structural_tag",
     "a structural tag is an object with structures and triggers, or with a format"),
    ({"structured_outputs": {"yaml": "x"}}, "structured_outputs", "yaml is not supported"),
    ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
])
def test_unsupported_or_invalid_constraints_are_400s_naming_them(client, extra, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                       extra_body=extra)
    error = e.value.body
    assert says in error["message"] and error["param"] == param
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=8, extra_body=extra)


def test_logit_bias_steers_and_bad_biases_are_400s(client, smol_tokenizer):
    prompt = "The capital of France is"
    greedy = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
              "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**greedy).choices[0].text
    forced = client.completions.create(**greedy, logit_bias={"504": 100}).choices[0].text
    assert forced == smol_tokenizer.decode([504] * 4)
    first = smol_tokenizer.encode(plain, add_special_tokens=False)[0]
    banned = client.completions.create(**greedy, logit_bias={str(first): -100}).choices[0].text
    assert not banned.startswith(smol_tokenizer.decode([first]))
    chat = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3,
                                          temperature=0, logit_bias={"504": 100})
    assert chat.choices[0].message.content == smol_tokenizer.decode([504] * 3)
    for bias, param in (({"999999": 1}, "logit_bias"), ({"5": 101}, "logit_bias"),
                        ({"five": 1}, "logit_bias"), ({"5": "high"}, "logit_bias")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                      logit_bias=bias)
        assert e.value.body["param"].startswith(param)
