"""The CRD: generated from the pydantic models, valid for Kubernetes, and rejecting bad specs
with readable messages (OpenAPI checks plus CEL rules evaluated with cel-python)."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from operator_support import CRD_PATH, EXAMPLES, admission_errors, crd_schema

from tokenmill.operator import crd, reconcile


def test_checked_in_crd_is_generated_from_the_models():
    assert CRD_PATH.read_text() == crd.render(), (
        "crds/ is stale: regenerate it as the docstring of operator/crd.py says")


def test_crd_is_a_valid_kubernetes_object():
    kubernetes_validate.validate(yaml.safe_load(CRD_PATH.read_text()), "1.31", strict=True)


def test_crd_names_columns_and_subresources():
    version = crd.crd()["spec"]["versions"][0]
    names = crd.crd()["spec"]["names"]
    assert names["shortNames"] == ["tmis"] and names["categories"] == ["tokenmill"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Model", "Replicas", "Ready", "URL", "Age"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}


def _walk(schema):
    yield schema
    for sub in schema.get("properties", {}).values():
        yield from _walk(sub)
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"])


def test_schema_is_structural():
    """No refs, no anyOf, a type on every node, properties or free-form, never both."""
    for node in _walk(crd_schema()):
        assert "$ref" not in node and "anyOf" not in node
        assert "type" in node
        assert not ("properties" in node and "additionalProperties" in node)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted_and_deployable(path):
    obj = yaml.safe_load(path.read_text())
    assert admission_errors(obj) == []
    reconcile.load(obj["metadata"]["name"], obj["spec"])


def test_there_are_the_three_examples():
    assert {p.name for p in EXAMPLES} == {
        "smollm2-cpu.yaml", "llama-8b-1gpu.yaml", "qwen-32b-tp2-fp8.yaml"}


BAD = [
    ({"engine": {"tensorParallelSize": 3}}, "tensorParallelSize must be one of 1, 2, 4, 8"),
    ({"engine": {"tensorParallelSize": 4}, "resources": {"gpus": 2}},
     "resources.gpus must be at least engine.tensorParallelSize"),
    ({"engine": {"tensorParallelSize": 2}, "resources": {"gpus": 0}},
     "resources.gpus must be at least engine.tensorParallelSize"),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
     "autoscaling.minReplicas must not be greater than autoscaling.maxReplicas"),
    ({"engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 32}},
     "maxNumBatchedTokens must be at least maxNumSeqs"),
    ({"engine": {"quantization": "int4"}}, "engine.quantization"),
    ({"engine": {"kvCacheDtype": "fp4"}}, "engine.kvCacheDtype"),
    ({"engine": {"gpuMemoryUtilization": 0}}, "engine.gpuMemoryUtilization"),
    ({"engine": {"gpuMemoryUtilization": 1.5}}, "engine.gpuMemoryUtilization"),
    ({"replicas": -1}, "replicas"),
    ({"model": {"uri": "hf://org/model"}}, "model.uri"),
    ({"resources": {"memory": "lots"}}, "resources.memory"),
    ({"autoscaling": {"mode": "keda"}}, "autoscaling.mode"),
    ({"autoscaling": {"minReplicas": 0}}, "autoscaling.minReplicas must be at least 1 in mode"),
    ({"enginee": {}}, "enginee: unknown field"),
]


@pytest.mark.parametrize(("spec", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_specs_are_rejected_at_apply(spec, message):
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}
    errors = admission_errors(obj)
    assert any(message in e for e in errors), errors


def test_long_names_are_rejected_at_apply():
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "a" * 64}, "spec": {}}
    assert any("at most 63 characters" in e for e in admission_errors(obj))


def test_minimal_spec_is_accepted_and_defaulted():
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}}
    assert admission_errors(obj) == []
