"""spec.engine.speculative: refused at apply (the CRD's schema and CEL rules, generated from the
engine contract's bounds) and by the operator with a message naming the spec's field, and
rendered as the engine's own --speculative-config, which the engine's parser reads back as
the spec asked."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
from operator_support import admission_errors, crd_schema, pod_template, served_config

from tokenmill.engine.contract import speculative as contract
from tokenmill.engine.contract.speculative import SpeculativeConfig
from tokenmill.operator import manifests
from tokenmill.operator.reconcile import load
from tokenmill.operator.spec import SpecError, parse

FIELD = "spec.engine.speculative"


def _obj(spec: dict) -> dict:
    return {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "x"}, "spec": spec}


def _spec(speculative: dict, **rest) -> dict:
    model = rest.pop("model", {"uri": "/models/llama"})
    return {"model": model, "engine": {"speculative": speculative}, **rest}


def _pod(spec: dict) -> dict:
    return pod_template(spec, "svc")


def _engine_config(spec: dict):
    return served_config(spec, "svc")


# --- rendering --------------------------------------------------------------------------------

def test_an_unset_speculative_renders_no_flag():
    command = _pod({"model": {"uri": "/models/llama"}})["containers"][0]["command"]
    assert not any("speculative" in arg for arg in command)
    assert _engine_config({"model": {"uri": "/models/llama"}}).speculative() is None


ROUND_TRIPS = [
    ({"method": "ngram", "numSpeculativeTokens": 4}, {},
     SpeculativeConfig("ngram", 4)),
    ({"method": "ngram", "numSpeculativeTokens": 16, "promptLookupMax": 64,
      "promptLookupMin": 64, "disableByBatchSize": 32}, {},
     SpeculativeConfig("ngram", 16, 64, 64, None, 32)),
    ({"method": "ngram", "numSpeculativeTokens": 1, "promptLookupMin": 3}, {},
     SpeculativeConfig("ngram", 1, 4, 3)),
    ({"method": "ngram", "numSpeculativeTokens": 2, "promptLookupMax": 2}, {},
     SpeculativeConfig("ngram", 2, 2, 1)),
    ({"method": "draft", "model": "/models/llama-1b", "numSpeculativeTokens": 5}, {},
     SpeculativeConfig("draft", 5, model="/models/llama-1b")),
    ({"method": "draft", "model": "smollm2-135m-instruct", "numSpeculativeTokens": 3,
      "disableByBatchSize": 8}, {},
     SpeculativeConfig("draft", 3, model="smollm2-135m-instruct", disable_by_batch_size=8)),
    # A draft on the main model's claim is read through the main model's mount.
    ({"method": "draft", "model": "pvc://weights/llama-1b", "numSpeculativeTokens": 4},
     {"model": {"uri": "pvc://weights/llama-8b"}},
     SpeculativeConfig("draft", 4, model="/mnt/models/llama-1b")),
    # A draft on a claim of its own gets a mount of its own.
    ({"method": "draft", "model": "pvc://drafts/llama/1b/", "numSpeculativeTokens": 4}, {},
     SpeculativeConfig("draft", 4, model="/mnt/draft-model/llama/1b")),
    ({"method": "draft", "model": "pvc://drafts/llama-1b", "numSpeculativeTokens": 4},
     {"model": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
     SpeculativeConfig("draft", 4, model="/mnt/draft-model/llama-1b")),
]


@pytest.mark.parametrize(("speculative", "rest", "expected"), ROUND_TRIPS,
                         ids=[str(i) for i in range(len(ROUND_TRIPS))])
def test_the_flag_round_trips_through_the_engines_parser(speculative, rest, expected):
    spec = _spec(speculative, **rest)
    assert admission_errors(_obj(spec)) == []
    assert _engine_config(spec).speculative() == expected


def test_the_flag_is_one_argument_of_json_with_vllms_keys():
    spec = _spec({"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 5})
    command = _pod(spec)["containers"][0]["command"]
    value = command[command.index("--speculative-config") + 1]
    assert value == ('{"method":"ngram","num_speculative_tokens":4,'
                     '"prompt_lookup_max":5}')


def test_a_draft_claim_of_its_own_is_mounted_read_only():
    pod = _pod(_spec({"method": "draft", "model": "pvc://drafts/llama-1b",
                      "numSpeculativeTokens": 4}))
    assert {"name": "draft-model", "persistentVolumeClaim": {
        "claimName": "drafts", "readOnly": True}} in pod["volumes"]
    assert {"name": "draft-model", "mountPath": "/mnt/draft-model", "readOnly": True} in (
        pod["containers"][0]["volumeMounts"])


def test_a_draft_on_the_models_claim_shares_its_volume():
    pod = _pod(_spec({"method": "draft", "model": "pvc://weights/llama-1b",
                      "numSpeculativeTokens": 4}, model={"uri": "pvc://weights/llama-8b"}))
    assert [v["name"] for v in pod["volumes"]] == ["scratch", "model"]


@pytest.mark.parametrize("model", ["/models/llama-1b", "smollm2-135m-instruct"])
def test_a_draft_in_the_image_needs_no_volume(model):
    pod = _pod(_spec({"method": "draft", "model": model, "numSpeculativeTokens": 4}))
    assert [v["name"] for v in pod["volumes"]] == ["scratch"]


@pytest.mark.parametrize("speculative", [
    {"method": "ngram", "numSpeculativeTokens": 4},
    {"method": "draft", "model": "pvc://drafts/llama-1b", "numSpeculativeTokens": 4},
])
def test_children_pass_kubernetes_schemas(speculative):
    spec = _spec(speculative)
    for child in manifests.children("svc", "team", "uid", load("svc", spec), "tokenmill:1"):
        kubernetes_validate.validate(child, "1.31", strict=True)


# --- refused at apply and by the operator, naming the spec's field ---------------------------

NGRAM = {"method": "ngram", "numSpeculativeTokens": 4}
BAD = [
    ({"method": "eagle", "numSpeculativeTokens": 4}, "method"),
    ({"method": "ngram"}, "numSpeculativeTokens"),
    ({"numSpeculativeTokens": 4}, "method"),
    ({**NGRAM, "numSpeculativeTokens": 0}, "numSpeculativeTokens"),
    ({**NGRAM, "numSpeculativeTokens": 17}, "numSpeculativeTokens"),
    ({**NGRAM, "numSpeculativeTokens": "4"}, "numSpeculativeTokens"),
    ({**NGRAM, "promptLookupMax": 0}, "promptLookupMax"),
    ({**NGRAM, "promptLookupMax": 65}, "promptLookupMax"),
    ({**NGRAM, "promptLookupMin": 0}, "promptLookupMin"),
    ({**NGRAM, "promptLookupMin": 5, "promptLookupMax": 3}, "promptLookupMin"),
    ({**NGRAM, "promptLookupMin": 5}, "promptLookupMin"),  # above the default maximum, 4
    ({**NGRAM, "disableByBatchSize": 0}, "disableByBatchSize"),
    ({"method": "draft", "numSpeculativeTokens": 4}, "model"),
    ({**NGRAM, "model": "/models/llama-1b"}, "model"),
    ({"method": "draft", "model": "llama-3.2-1b", "numSpeculativeTokens": 4}, "model"),
    ({"method": "draft", "model": "gs://bucket/draft", "numSpeculativeTokens": 4}, "model"),
    ({"method": "draft", "model": "/models/../etc", "numSpeculativeTokens": 4}, "model"),
    ({"method": "draft", "model": "pvc://drafts/../../x", "numSpeculativeTokens": 4}, "model"),
    ({**NGRAM, "num_speculative_tokens": 4}, "num_speculative_tokens"),  # vLLM's key, not ours
]


def _names(where: str, message: str) -> bool:
    """Whether a message names the field: its path, or its parent's path and its name (the
    form of 'is a required property')."""
    parent, _, leaf = where.rpartition(".")
    return where in message or (parent in message and f"'{leaf}'" in message)


@pytest.mark.parametrize(("speculative", "field"), BAD, ids=[str(s) for s, _ in BAD])
def test_a_spec_that_cannot_run_is_refused_naming_the_field(speculative, field):
    where = f"{FIELD}.{field}"
    errors = admission_errors(_obj(_spec(speculative)))
    assert any(_names(where, e) for e in errors), errors
    with pytest.raises(SpecError) as refused:
        load("x", _spec(speculative))
    assert _names(where, str(refused.value)), refused.value


@pytest.mark.parametrize("model", ["hf://meta-llama/Llama-3.2-1B", "s3://models/llama-1b"])
def test_a_draft_to_download_is_refused_with_what_to_do_instead(model):
    """The download init container fetches the served model alone: a draft from the hub or S3
    goes into the image or onto a claim."""
    speculative = {"method": "draft", "model": model, "numSpeculativeTokens": 4}
    (error,) = admission_errors(_obj(_spec(speculative)))
    assert f"{FIELD}.model" in error and "pvc://CLAIM/PATH" in error
    assert "hf:// or s3://" in error
    with pytest.raises(SpecError, match=re.escape("pvc://CLAIM/PATH")):
        load("x", _spec(speculative))


def test_a_method_outside_the_set_is_one_message_naming_the_methods():
    errors = admission_errors(_obj(_spec({"method": "eagle", "numSpeculativeTokens": 4,
                                          "model": "/models/x"})))
    assert len(errors) == 1, errors
    assert all(m in errors[0] for m in contract.METHODS)


def test_extra_args_may_not_set_it_again():
    spec = {"model": {"uri": "/models/llama"},
            "engine": {"extraArgs": ["--speculative-config", '{"method": "ngram"}']}}
    with pytest.raises(SpecError, match=re.escape("is set by spec.engine.speculative")):
        load("x", spec)


def test_the_engine_contract_has_the_last_word(monkeypatch):
    """A bound the engine tightens reaches the operator's check through the contract, named as
    the spec's field."""
    monkeypatch.setattr(contract, "MAX_SPECULATIVE_TOKENS", 8)
    with pytest.raises(SpecError) as refused:
        load("x", _spec({**NGRAM, "numSpeculativeTokens": 12}))
    assert str(refused.value) == (f"{FIELD}.numSpeculativeTokens: numSpeculativeTokens must be "
                                  "in 1..8, got 12")


def test_a_contract_message_naming_several_keys_names_the_object(monkeypatch):
    def parse(text):
        raise contract.SpeculativeConfigError(
            "unknown keys ['k']; known: ['method', 'num_speculative_tokens']")

    monkeypatch.setattr(contract.SpeculativeConfig, "parse", staticmethod(parse))
    with pytest.raises(SpecError) as refused:
        load("x", _spec(NGRAM))
    assert str(refused.value) == (f"{FIELD}: unknown keys ['k']; known: [method, "
                                  "numSpeculativeTokens]")


def test_the_crds_bounds_are_the_contracts():
    node = crd_schema()["properties"]["spec"]["properties"]["engine"]["properties"][
        "speculative"]
    fields = node["properties"]
    assert sorted(node["required"]) == ["method", "numSpeculativeTokens"]
    assert (fields["numSpeculativeTokens"]["minimum"],
            fields["numSpeculativeTokens"]["maximum"]) == (1, contract.MAX_SPECULATIVE_TOKENS)
    for key in ("promptLookupMax", "promptLookupMin"):
        assert fields[key]["maximum"] == contract.MAX_PROMPT_LOOKUP
    assert "default" not in fields["promptLookupMax"]  # the engine's default applies
    (rule,) = fields["method"]["x-kubernetes-validations"]
    assert rule["rule"] == f"self in [{', '.join(repr(m) for m in contract.METHODS)}]"


def test_the_operator_reads_what_the_crd_admits():
    spec = parse(_spec({**NGRAM, "promptLookupMax": 6, "disableByBatchSize": 16}))
    speculative = spec.engine.speculative
    assert (speculative.method, speculative.num_speculative_tokens,
            speculative.prompt_lookup_max, speculative.prompt_lookup_min,
            speculative.disable_by_batch_size) == ("ngram", 4, 6, None, 16)
