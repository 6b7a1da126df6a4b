"""Structured outputs and logit_bias in the engine: constrained and free requests in one batch,
n > 1, preemption, compile errors, and the pieces (schema checks, bitmasks, biases) alone."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch
from engine_support import record_host_reads, tiny_llama_block_bytes
from structured_support import ASK, PERSON

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.core.sampler import apply_logit_bias
from tokenmill.engine.core.sampling_params import SamplingParamsError
from tokenmill.engine.core.structured import (
    StructuredOutputsError,
    StructuredOutputsParams,
    bitmask,
)

pytest.importorskip("xgrammar")


def _json(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 64)
    return SamplingParams(structured_outputs=StructuredOutputsParams(json=PERSON), **kw)


def _valid(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    return value


# ---- the pieces ---------------------------------------------------------------------------

@pytest.mark.parametrize("schema, named", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     "'uniqueItems' at /"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
     "'not' (negation) at /properties/a"),
    ({"type": "string", "format": "idn-email"}, "'format': 'idn-email' at /"),
    ({"format": "binary"}, "'format': 'binary' at /"),
    ({"type": ["integer", "string"], "format": "int64"}, "'format': 'int64' at /"),
    ({"$ref": "https://example.com/person.json"}, "'$ref' to another document"),
    ({"type": "number", "multipleOf": 0.5}, "'multipleOf' on a non-integer at /"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "'allOf' with more than one"),
    ({"type": "object", "properties": {"k": {"type": "string", "pattern": "^(?!x)"}}},
     "lookaround in 'pattern' at /properties/k"),
    ({"type": "array", "items": {"if": {"type": "string"}, "then": {"minLength": 2}}},
     "'if' (conditional subschemas) at /items"),
    ({"$defs": {"a/b": {"type": "array", "contains": {"const": 1}}}},
     "'contains' (array contains) at /$defs/a~1b"),
    ({"anyOf": []}, "an empty 'anyOf' (no value can match) at /"),
    ({"type": "object", "properties": {"a": {"oneOf": []}}, "required": ["a"]},
     "an empty 'oneOf' (no value can match) at /properties/a"),
    ({"type": "array", "items": {"anyOf": []}, "minItems": 1},
     "an empty 'anyOf' (no value can match) at /items"),
    ({"enum": []}, "an empty 'enum' (no value can match) at /"),
])
def test_unsupported_schema_features_are_named_with_their_place(schema, named):
    with pytest.raises(StructuredOutputsError, match="unsupported JSON Schema features") as e:
        StructuredOutputsParams(json=schema)
    assert named in str(e.value)


def test_an_empty_alternative_where_no_value_must_be_is_left_to_the_grammar():
    """An optional property, items of an array that may be empty, one branch of several: the
    grammar leaves the place out, so such schemas are served."""
    for schema in ({"type": "object", "properties": {"a": {"anyOf": []}, "b": {"type": "integer"}},
                    "required": ["b"]},
                   {"type": "array", "items": {"oneOf": []}},
                   {"anyOf": [{"type": "integer"}, {"anyOf": []}]}):
        StructuredOutputsParams(json=schema)


def test_supported_schema_features_pass_and_annotations_are_ignored():
    schema = {"$defs": {"tag": {"enum": ["a", "b"]}}, "title": "T", "description": "d",
              "type": "object", "examples": [{}], "x-vendor": 1,
              "properties": {"t": {"$ref": "#/$defs/tag"},
                             "n": {"type": "integer", "multipleOf": 5, "default": 5},
                             "s": {"type": "string", "format": "date", "pattern": "^2"},
                             "u": {"anyOf": [{"type": "null"}, {"type": "number"}]},
                             "l": {"type": "array", "items": {"type": "string"}, "maxItems": 2,
                                   "uniqueItems": False}}}
    assert StructuredOutputsParams(json=schema).schema() == schema


def test_a_format_on_a_value_that_cannot_be_a_string_is_ignored(smol_llm):
    """OpenAPI's numeric formats, as generated tool schemas carry them: JSON Schema applies
    formats to strings only, so they constrain nothing and the grammar's numbers hold."""
    schema = {"type": "object", "required": ["n", "x"], "additionalProperties": False,
              "properties": {"n": {"type": "integer", "format": "int32"},
                             "x": {"type": ["number", "null"], "format": "double"}}}
    constraint = StructuredOutputsParams(json=schema)
    assert constraint.schema() == schema
    chat = smol_llm.apply_chat_template(
        [{"role": "user", "content": "Give n as 7 and x as 2.5, in JSON."}])
    out = smol_llm.generate([chat], SamplingParams(temperature=0.0, max_tokens=64,
                                                   structured_outputs=constraint))[0].outputs[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), schema)


def test_constraint_params_need_exactly_one_kind_and_compare_by_value():
    with pytest.raises(StructuredOutputsError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(StructuredOutputsError, match="json, regex"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(StructuredOutputsError, match="non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(StructuredOutputsError, match="not valid JSON"):
        StructuredOutputsParams(json="{nope")
    assert StructuredOutputsParams(json=json.dumps(PERSON)) == StructuredOutputsParams(json=PERSON)
    assert StructuredOutputsParams(choice=["a", "b"]).kind == "choice"
    with pytest.raises(StructuredOutputsError, match="lookaround"):
        StructuredOutputsParams(regex="(?<=a)b")


def test_sampling_params_take_a_dict_constraint_and_check_logit_bias():
    params = SamplingParams(structured_outputs={"regex": "[0-9]+"}, logit_bias={"7": 5, 9: -1.5})
    assert params.structured_outputs == StructuredOutputsParams(regex="[0-9]+")
    assert params.logit_bias == {7: 5.0, 9: -1.5}
    with pytest.raises(SamplingParamsError, match="^structured_outputs: unsupported JSON"):
        SamplingParams(structured_outputs={"json": {"not": {}}})
    with pytest.raises(SamplingParamsError, match="^structured_outputs:"):
        SamplingParams(structured_outputs={"jsn": {}})
    for bad in ({"x": 1}, {"5": 101}, {"5": -100.5}, {-1: 0}, {"5": True}, {1.5: 1}):
        with pytest.raises(SamplingParamsError, match="^logit_bias:"):
            SamplingParams(logit_bias=bad)
    assert SamplingParams(logit_bias={}).logit_bias is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # xgrammar's kernel; torch
def test_bitmask_masks_only_the_constrained_rows(dtype):
    vocab, rows = 70, [0, 2]  # 70: the last word is partly outside the vocabulary
    rng = random.Random(0)
    allowed = [set(rng.sample(range(vocab), 9)) for _ in rows]

    class Fixed:
        def __init__(self, tokens):
            self.tokens = tokens

        def fill_bitmask(self, mask, row):
            bits = [0] * bitmask.words(vocab)
            for t in self.tokens:
                bits[t // 32] |= 1 << (t % 32)
            mask[row] = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits],
                                     dtype=torch.int32)

    logits = torch.randn(3, vocab, dtype=dtype)
    masked = logits.clone()
    masks = bitmask.fill([(row, Fixed(a)) for row, a in zip(rows, allowed, strict=True)], 3,
                         vocab, logits.device)
    bitmask.apply(masked, masks, rows)
    for row, tokens in zip(rows, allowed, strict=True):
        finite = set(torch.isfinite(masked[row]).nonzero().flatten().tolist())
        assert finite == tokens
        assert torch.equal(masked[row][sorted(finite)], logits[row][sorted(finite)])
    assert torch.equal(masked[1], logits[1])


def test_logit_bias_is_one_scatter_add_equal_to_a_loop():
    logits = torch.randn(4, 50)
    biases = [(0, {3: 5.0, 7: -100.0}), (2, {3: 1.5}), (3, {49: 100.0, 0: -2.0})]
    expected = logits.clone()
    for row, bias in biases:
        for token, value in bias.items():
            expected[row, token] += value
    apply_logit_bias(logits, biases)
    assert torch.equal(logits, expected)


# ---- the engine on SmolLM2 ----------------------------------------------------------------

def test_constrained_and_free_requests_share_steps_and_free_outputs_do_not_change(smol_llm):
    engine = smol_llm.engine
    chat = smol_llm.apply_chat_template(ASK)
    free_prompts = ["The three primary colors are", "Once upon a time"]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in smol_llm.generate(free_prompts, greedy)]

    requests = {
        "free-0": (free_prompts[0], greedy),
        "json": (chat, _json(temperature=0.0)),
        "free-1": (free_prompts[1], greedy),
        "regex": (chat, SamplingParams(temperature=1.0, seed=5, max_tokens=24,
                                       structured_outputs=StructuredOutputsParams(
                                           regex=r"[A-Z][a-z]{2,8} \d{2}"))),
        "choice": (chat, SamplingParams(temperature=1.0, seed=2, max_tokens=8,
                                        structured_outputs=StructuredOutputsParams(
                                            choice=["yes", "no", "not sure"]))),
    }
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    done, mixed_steps = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        ran = {seq.request_id for seq, _ in engine.last_plan.scheduled}
        mixed_steps += bool(ran & {"json", "regex"}) and bool(ran & {"free-0", "free-1"})
        done.update({o.request_id: o.outputs[0] for o in outputs if o.finished})
    assert mixed_steps >= 10
    assert [done["free-0"].token_ids, done["free-1"].token_ids] == alone
    person = _valid(done["json"].text)
    assert done["json"].finish_reason == "stop" and person["mood"] in ("happy", "sad", "calm")
    assert re.fullmatch(r"[A-Z][a-z]{2,8} \d{2}", done["regex"].text)
    assert done["choice"].text in ("yes", "no", "not sure")
    assert done["choice"].finish_reason == done["regex"].finish_reason == "stop"
    engine.kv.allocator.check_all_free()


def test_each_of_n_samples_follows_the_schema_on_its_own(smol_llm):
    chat = smol_llm.apply_chat_template(ASK)
    out = smol_llm.generate([chat], _json(n=6, temperature=1.0, seed=11))[0]
    people = [_valid(c.text) for c in out.outputs]
    assert all(c.finish_reason == "stop" for c in out.outputs)
    assert len({json.dumps(p, sort_keys=True) for p in people}) >= 3
    again = smol_llm.generate([chat], _json(n=6, temperature=1.0, seed=11))[0]
    assert [c.text for c in again.outputs] == [c.text for c in out.outputs]


def test_json_object_and_grammar_constraints(smol_llm):
    chat = smol_llm.apply_chat_template(
        [{"role": "user", "content": 'Reply with a JSON object whose "city" is Paris and '
                                     'whose "country" is France.'}])
    obj = smol_llm.generate([chat], SamplingParams(
        temperature=0.0, max_tokens=120,
        structured_outputs=StructuredOutputsParams(json_object=True)))[0].outputs[0]
    assert obj.finish_reason == "stop" and json.loads(obj.text)["city"] == "Paris"
    grammar = 'root ::= "x=" digit digit ";"\ndigit ::= [0-9]'
    g = smol_llm.generate([chat], SamplingParams(
        temperature=1.0, seed=1, max_tokens=10,
        structured_outputs=StructuredOutputsParams(grammar=grammar)))[0].outputs[0]
    assert re.fullmatch(r"x=\d\d;", g.text) and g.finish_reason == "stop"


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_structural_tags_format_holds_the_whole_reply(smol_llm):
    """xgrammar's form of vLLM's structural_tag: the reply is the tag, its content the
    schema's JSON."""
    tag = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<answer>", "end": "</answer>",
        "content": {"type": "json_schema", "json_schema": CITY}}}
    out = smol_llm.chat([{"role": "user", "content": "What is the capital of France? Reply "
                                                     "with JSON."}],
                        SamplingParams(temperature=0.0, max_tokens=40,
                                       structured_outputs={"structural_tag": tag}))[0].outputs[0]
    assert out.finish_reason == "stop"
    body = re.fullmatch(r"<answer>(.*)</answer>", out.text, re.DOTALL)
    assert body and jsonschema.validate(json.loads(body[1]), CITY) is None


def test_a_structural_tags_trigger_opens_a_segment_held_to_its_schema(smol_llm):
    """vLLM's form (structures and triggers): free text until a trigger, then the structure's
    begin, its schema's JSON and its end; checked token by token on the compiled grammar."""
    params = StructuredOutputsParams(structural_tag={
        "structures": [{"begin": "<f>", "schema": CITY, "end": "</f>"}], "triggers": ["<f>"]})
    structured, tokenizer = smol_llm.engine.structured, smol_llm.tokenizer
    matcher = structured.matcher(params)
    vocab = smol_llm.engine.model_config.vocab_size

    def allowed() -> torch.Tensor:
        return bitmask.fill([(0, matcher)], 1, vocab, torch.device("cpu"))[0]

    letters = tokenizer.encode("Hello", add_special_tokens=False)
    assert bitmask.allows_any(allowed(), letters)  # free text first
    for token in tokenizer.encode("Sure: <f>{", add_special_tokens=False):
        assert matcher.accept(token)
    # Inside the segment: "city" is required, so the object cannot close yet.
    assert not bitmask.allows_any(allowed(), tokenizer.encode("}", add_special_tokens=False))
    for token in tokenizer.encode('"city": "Paris"}</f>', add_special_tokens=False):
        assert matcher.accept(token)
    assert bitmask.allows_any(allowed(), letters)  # free text again after the end
    with pytest.raises(StructuredOutputsError, match="structures\\[0\\] needs begin and end"):
        StructuredOutputsParams(structural_tag={"structures": [{"begin": "<f>"}],
                                                "triggers": ["<f>"]})


@pytest.mark.parametrize("constraint, says", [
    (StructuredOutputsParams(regex="(ab"), "the regex does not compile"),
    (StructuredOutputsParams(grammar="root ::= missing"), "the grammar does not compile"),
    (StructuredOutputsParams(json={"type": "integr"}), "the JSON schema does not compile"),
])
def test_a_constraint_that_does_not_compile_is_a_request_error(smol_llm, constraint, says):
    engine = smol_llm.engine
    with pytest.raises(RequestError, match=says) as e:
        engine.add_request("bad", "Hi", SamplingParams(structured_outputs=constraint))
    assert e.value.param == "structured_outputs"
    assert "/project/" not in str(e.value)  # no C++ source location
    assert not engine.has_unfinished_requests()


def test_past_the_grammar_end_ignore_eos_generates_freely(smol_llm):
    out = smol_llm.generate(["Hi"], SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True,
        structured_outputs=StructuredOutputsParams(choice=["Hello"])))[0].outputs[0]
    assert len(out.token_ids) == 6 and out.text.startswith("Hello")


def test_logit_bias_steers_and_bad_ids_are_request_errors(smol_llm):
    prompt = "The capital of France is"
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    plain = smol_llm.generate([prompt], greedy)[0].outputs[0].token_ids
    forced = smol_llm.generate([prompt], SamplingParams(
        temperature=0.0, max_tokens=4, ignore_eos=True, logit_bias={"504": 100}))
    assert forced[0].outputs[0].token_ids == [504] * 4
    banned = smol_llm.generate([prompt], SamplingParams(
        temperature=0.0, max_tokens=4, ignore_eos=True, logit_bias={plain[0]: -100}))
    assert banned[0].outputs[0].token_ids[0] != plain[0]
    sampled = smol_llm.generate([prompt], SamplingParams(
        temperature=1.0, seed=3, max_tokens=8, ignore_eos=True,
        logit_bias={t: -100 for t in plain}))
    assert not set(sampled[0].outputs[0].token_ids) & set(plain)
    vocab = smol_llm.engine.model_config.vocab_size
    with pytest.raises(RequestError, match=rf"logit_bias: token ids must be in \[0, {vocab}\)"):
        smol_llm.engine.add_request("bad", prompt, SamplingParams(logit_bias={vocab: 1}))
    assert not smol_llm.engine.has_unfinished_requests()


# ---- preemption on a tiny random-weight Llama ---------------------------------------------

def test_preempted_constrained_sequences_resume_their_grammar(tiny_llama_dir, tiny_llama):
    rng = random.Random(4)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(10, 40))]
               for _ in range(6)]
    params = [_json(temperature=0.0, max_tokens=60) if i % 2 == 0 else
              SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
              for i in range(6)]
    expected = [tiny_llama.generate([p], sp)[0].outputs[0] for p, sp in zip(prompts, params,
                                                                              strict=True)]
    small = LLM(tiny_llama_dir, show_progress=False, block_size=8,
                kv_cache_memory=12 * tiny_llama_block_bytes(tiny_llama, 8))
    outputs = small.generate(prompts, params)
    assert small.engine.scheduler.num_preemptions > 0
    assert any(o.num_preemptions for o in outputs[::2])  # a constrained one was preempted
    assert [o.outputs[0].token_ids for o in outputs] == [e.token_ids for e in expected]
    for out in outputs[::2]:
        if out.outputs[0].finish_reason == "stop":
            _valid(out.outputs[0].text)
    small.engine.kv.allocator.check_all_free()


def test_the_grammar_library_loads_only_for_a_constrained_request(monkeypatch):
    import subprocess
    import sys

    code = ("import sys; import tokenmill.engine.core.engine; "
            "import tokenmill.engine.server.openai_serving; "
            "from tokenmill.engine import SamplingParams; "
            "SamplingParams(structured_outputs={'json': {'type': 'object'}}); "
            "sys.exit('xgrammar' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0
    from tokenmill.engine.core.structured.backend import GrammarError, StructuredOutputs

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # as if not installed
    with pytest.raises(GrammarError, match="need the xgrammar package"):
        StructuredOutputs(None, 10, {2}).compile(StructuredOutputsParams(regex="a"))


def test_masks_and_biases_add_no_host_transfer(smol_llm, monkeypatch):
    """The sampler still reads the step's results once, with constrained and biased rows."""
    from tokenmill.engine.core.request import RequestTimings
    from tokenmill.engine.core.sampler import sample

    engine = smol_llm.engine
    params = [_json(temperature=0.0), SamplingParams(temperature=0.8, seed=1, logit_bias={5: 3}),
              _json(temperature=1.0, seed=2), SamplingParams(temperature=0.0)]
    seqs = [engine._new_sequence(f"t{i}", 0, [1, 2, 3], p, RequestTimings(), None)
            for i, p in enumerate(params)]
    logits = torch.randn(len(seqs), engine.model_config.vocab_size)
    reads = record_host_reads(monkeypatch)
    result = sample(logits, seqs)
    assert reads == ["tolist"]
    assert seqs[0].constraint.accept(result.token_ids[0])
    assert seqs[2].constraint.accept(result.token_ids[2])
    assert result.token_ids[3] == int(logits[3].argmax())  # free row untouched


@pytest.mark.parametrize("choice", ["smile 😀", "café", 'quo"te', "new\nline", "back\\slash"])
def test_every_choice_is_reachable_spelled_as_itself(smol_llm, choice):
    """A choice's characters are the grammar's as they are: an emoji escaped to JSON's
    surrogate pair was two halves no token spells, so the choice could never be produced."""
    from tokenmill.engine.core.structured.backend import StructuredOutputs

    tokenizer = smol_llm.tokenizer
    structured = StructuredOutputs(tokenizer, smol_llm.engine.model_config.vocab_size, {2})
    matcher = structured.matcher(StructuredOutputsParams(choice=[choice, "other"]))
    assert all(matcher.accept(t) for t in tokenizer.encode(choice, add_special_tokens=False))
    assert matcher.is_complete


def test_a_choice_of_emoji_is_answered_with_one_of_them(smol_llm):
    choices = ["😀", "🙁"]
    outputs = smol_llm.generate(["How do you feel?"] * 3, [
        SamplingParams(temperature=t, seed=s, max_tokens=12,
                       structured_outputs=StructuredOutputsParams(choice=choices))
        for t, s in ((0.0, None), (1.0, 1), (1.0, 2))])
    for out in outputs:
        assert out.outputs[0].text in choices and out.outputs[0].finish_reason == "stop"


def test_compiled_grammars_are_held_by_the_engines_cache_alone(monkeypatch):
    """xgrammar's own cache kept every grammar ever compiled, without bound."""
    from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
    from tokenmill.engine.core.structured import backend
    from tokenmill.engine.core.structured.backend import StructuredOutputs

    monkeypatch.setattr(backend, "CACHE_SIZE", 3)
    structured = StructuredOutputs(word_level_tokenizer(64), 64, {2})
    for i in range(8):
        structured.compile(StructuredOutputsParams(regex=f"w{i}( w[0-9]+)*"))
    assert len(structured._cache) == 3
    assert structured._compiler.get_cache_size_bytes() == 0


def test_allowed_token_ids_that_cannot_begin_the_format_are_refused(smol_llm):
    tokenizer = smol_llm.tokenizer
    [no] = tokenizer.encode("no", add_special_tokens=False)
    with pytest.raises(RequestError, match="none of its tokens can begin") as e:
        smol_llm.engine.add_request("disjoint", "Hi", SamplingParams(
            allowed_token_ids=[no],
            structured_outputs=StructuredOutputsParams(choice=["yes"])))
    assert e.value.param == "allowed_token_ids"
    assert not smol_llm.engine.has_unfinished_requests()


def test_where_allowed_token_ids_part_from_the_grammar_later_the_grammar_wins(smol_llm):
    """They meet at the first token, then not: the row had no token left to draw and took
    token 0, which the grammar refused, ending the reply as aborted."""
    tokenizer = smol_llm.tokenizer
    [a] = tokenizer.encode("a", add_special_tokens=False)
    out = smol_llm.generate(["Hi"], SamplingParams(
        temperature=0.0, max_tokens=8, allowed_token_ids=[a],
        structured_outputs=StructuredOutputsParams(regex="ab")))[0].outputs[0]
    assert out.text == "ab" and out.finish_reason == "stop"
    assert 0 not in out.token_ids


def test_grammar_allowed_token_ids_and_min_tokens_together_leave_a_token(smol_llm):
    """Each pair of grammar, allowed_token_ids and min_tokens' ban of EOS meets; all three do
    not. At the first step that is a 400; at a later one the grammar wins, where the row had
    no token left and drew token 0."""
    tokenizer = smol_llm.tokenizer
    [x] = tokenizer.encode("x", add_special_tokens=False)
    [y] = tokenizer.encode("y", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    with pytest.raises(RequestError, match="none of its tokens can begin") as e:
        smol_llm.engine.add_request("three", "Hi", SamplingParams(
            allowed_token_ids=[eos, y], min_tokens=1,
            structured_outputs=StructuredOutputsParams(regex="(x)?")))
    assert e.value.param == "allowed_token_ids"
    # After x the grammar allows z or the end; allowed_token_ids x or EOS; min_tokens bans EOS.
    [z] = tokenizer.encode("z", add_special_tokens=False)
    out = smol_llm.generate(["Hi"], SamplingParams(
        temperature=0.0, max_tokens=8, allowed_token_ids=[x, eos], min_tokens=2,
        structured_outputs=StructuredOutputsParams(regex="x(z)?")))[0].outputs[0]
    assert out.token_ids[:2] == [x, z] and out.finish_reason == "stop"
