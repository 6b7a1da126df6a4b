"""The CRD: generated from the pydantic models, valid for Kubernetes, and rejecting bad specs
with readable messages (OpenAPI checks plus CEL rules evaluated with cel-python)."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from apiserver_model import cost_problems, crd_problems, default_problems, rule_problems
from operator_support import (
    CRD_PATH,
    EXAMPLES,
    SKIPPED_RULES,
    admission_errors,
    crd_schema,
    with_defaults,
)

from tokenmill.operator import crd, reconcile


def test_checked_in_crd_is_generated_from_the_models():
    assert CRD_PATH.read_text() == crd.render(), (
        "crds/ is stale: regenerate it as the docstring of operator/crd.py says")


def test_every_default_passes_its_nodes_rules_as_written():
    """The API server checks each `default` against its node's schema and CEL rules without
    filling nested defaults: `spec: {default: {}}` meets every rule of spec with no fields."""
    assert default_problems(crd_schema()) == []


def test_every_rule_compiles_and_stays_within_the_cost_budget():
    assert rule_problems(crd_schema()) == []
    assert cost_problems(crd_schema()) == []


def test_the_api_server_would_create_the_crd():
    assert crd_problems(yaml.safe_load(CRD_PATH.read_text())) == []


def test_crd_is_a_valid_kubernetes_object():
    kubernetes_validate.validate(yaml.safe_load(CRD_PATH.read_text()), "1.31", strict=True)


def test_crd_names_columns_and_subresources():
    version = crd.crd()["spec"]["versions"][0]
    names = crd.crd()["spec"]["names"]
    assert names["shortNames"] == ["tmis"] and names["categories"] == ["tokenmill"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Model", "Replicas", "Ready", "Reason", "URL", "Age", "Message"]
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
        assert "type" in node or node.get("x-kubernetes-int-or-string") is True
        assert not ("properties" in node and "additionalProperties" in node)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted_and_deployable(path):
    obj = yaml.safe_load(path.read_text())
    assert admission_errors(obj) == []
    reconcile.load(obj["metadata"]["name"], obj["spec"])


def test_there_are_the_eight_examples():
    assert {p.name for p in EXAMPLES} == {
        "smollm2-cpu.yaml", "llama-8b-1gpu.yaml", "qwen3-8b-autoscaled.yaml",
        "qwen3-hf-cache.yaml", "llama-8b-lora.yaml", "qwen3-reranker.yaml",
        "bge-embeddings-cpu.yaml", "qwen2.5-vl-7b.yaml"}


BAD = [
    ({"engine": {"tensorParallelSize": 3}}, "engine.tensorParallelSize must be 1, 2, 4 or 8"),
    ({"engine": {"tensorParallelSize": 16}}, "engine.tensorParallelSize must be 1, 2, 4 or 8"),
    # The built-in model (the default) has 9 attention heads and 3 KV heads: only 1 divides.
    ({"engine": {"tensorParallelSize": 2}},
     "engine.tensorParallelSize must divide the attention heads of smollm2-135m-instruct "
     "(9 attention heads, 3 KV heads"),
    ({"model": {"uri": "smollm2-135m-instruct"}, "engine": {"tensorParallelSize": 8},
      "resources": {"gpus": 8}},
     "engine.tensorParallelSize must divide the attention heads of smollm2-135m-instruct"),
    ({"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 8},
      "resources": {"gpus": 4}}, "resources.gpus must be at least engine.tensorParallelSize"),
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
    ({"model": {"uri": "gs://bucket/model"}}, "model.uri"),
    ({"resources": {"memory": "lots"}}, "resources.memory"),
    ({"autoscaling": {"mode": "keda2"}}, "autoscaling.mode"),
    ({"autoscaling": {"minReplicas": 0}}, "autoscaling.minReplicas must be at least 1 in mode"),
    ({"enginee": {}}, "enginee: unknown field"),
    # Pod fields the Deployment API would refuse (422) are refused here, at apply.
    ({"resources": {"gpuResourceName": "gpu"}}, "spec.resources.gpuResourceName"),
    ({"resources": {"gpuResourceName": "nvidia.com/gpu x"}}, "spec.resources.gpuResourceName"),
    ({"nodeSelector": {"bad key!": "x"}}, "every nodeSelector key must be a Kubernetes qualified"),
    ({"nodeSelector": {"zone": "not a label value"}}, "spec.nodeSelector.zone"),
    ({"env": [{"name": "1 BAD", "value": "x"}]}, "spec.env.0.name"),
    ({"env": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.name"}}}]}, "env: set value or valueFrom, not both"),
    ({"serviceAccountName": "My_Account"}, "spec.serviceAccountName"),
    ({"podAnnotations": {"bad key": "x"}}, "every podAnnotations key must be a Kubernetes"),
    ({"image": "registry.local/tokenmill: latest"}, "spec.image"),
    ({"model": {"uri": "pvc://models/../../etc"}}, "model.uri must not contain '..'"),
    ({"model": {"uri": "/models/../etc/passwd"}}, "model.uri must not contain '..'"),
    # The API key comes from a Secret the kubelet reads; the spec only names it.
    ({"auth": {"apiKeySecretRef": {"key": "api-key"}}}, "'name' is a required property"),
    ({"auth": {"apiKeySecretRef": {"name": "My_Secret"}}}, "spec.auth.apiKeySecretRef.name"),
    ({"auth": {"apiKeySecretRef": {"name": "s", "key": "a/b"}}},
     "spec.auth.apiKeySecretRef.key"),
    ({"auth": {"apiKeySecretRef": {"name": "s", "key": ".."}}}, "spec.auth.apiKeySecretRef.key"),
    ({"auth": {"apiKeySecretRef": {"name": "s", "value": "sk-1"}}},
     "spec.auth.apiKeySecretRef.value: unknown field"),
    ({"auth": {"apiKey": "sk-1"}}, "spec.auth.apiKey: unknown field"),
    ({"auth": {"apiKeySecretRef": {"name": "s"}},
      "env": [{"name": "TOKENMILL_API_KEY", "value": "sk-1"}]},
     "env: TOKENMILL_API_KEY is set by auth.apiKeySecretRef"),
]


# Kubernetes-typed fields: the schema comes from the Kubernetes API; without the API server's
# schema check (an old server, an emulator) the Deployment API refuses them (InvalidSpec).
BAD_KUBERNETES_TYPED = [
    ({"tolerations": [{"key": "gpu", "operator": "Exist"}]}, "spec.tolerations.0.operator"),
    ({"tolerations": [{"key": "gpu", "efect": "NoSchedule"}]},
     "spec.tolerations.0.efect: unknown field"),
    ({"tolerations": [{"key": "gpu", "tolerationSeconds": "10"}]},
     "spec.tolerations.0.tolerationSeconds"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Within"}]}]}}}},
     "matchExpressions.0.operator"),
    ({"affinity": {"nodeAffinity": {"required": {}}}}, "nodeAffinity.required: unknown field"),
    ({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {}}]}}}, "'topologyKey' is a required property"),
    ({"env": [{"name": "A", "valueFrom": {"secretRef": {"name": "s"}}}]},
     "valueFrom.secretRef: unknown field"),
    ({"podSecurityContext": {"runAsUser": "root"}}, "spec.podSecurityContext.runAsUser"),
    ({"containerSecurityContext": {"capabilities": {"drop": "ALL"}}},
     "spec.containerSecurityContext.capabilities.drop"),
]


@pytest.mark.parametrize(("spec", "message"), BAD + BAD_KUBERNETES_TYPED,
                         ids=[m for _, m in BAD + BAD_KUBERNETES_TYPED])
def test_bad_specs_are_rejected_at_apply(spec, message):
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}
    errors = admission_errors(obj)
    assert any(message in e for e in errors), errors


def test_long_names_are_rejected_at_apply():
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "a" * 64}, "spec": {}}
    assert any("at most 63 characters" in e for e in admission_errors(obj))


@pytest.mark.parametrize("engine", [
    {"quantization": "int8"}, {"quantization": "fp8"}, {"kvCacheDtype": "int8"},
    {"kvCacheDtype": "fp8"}, {"kvCacheDtype": "fp8_e5m2"},
    {"quantization": "fp8", "kvCacheDtype": "fp8"}])
def test_quantization_is_admitted_and_deployable(engine):
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": {"engine": engine}}
    assert admission_errors(obj) == []
    reconcile.load("x", obj["spec"])


@pytest.mark.parametrize("spec", [
    {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 2}},
    {"model": {"uri": "pvc://weights/llama"}, "engine": {"tensorParallelSize": 4}},
    {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 8},
     "resources": {"gpus": 8}},
    {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 2},
     "resources": {"gpus": 4}},
    {"model": {"uri": "smollm2-135m-instruct"}, "engine": {"tensorParallelSize": 1}},
], ids=["tp2", "tp4-pvc", "tp8-gpus8", "tp2-gpus4", "smollm2-tp1"])
def test_tensor_parallelism_is_admitted_and_deployable(spec):
    """A model the operator cannot see into is admitted at every size the API defines; the
    engine checks its heads when it loads the model's config."""
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}
    assert admission_errors(obj) == []
    reconcile.load("x", spec)


@pytest.mark.parametrize("name", ["my.model", "My-model", "1model", "model-"])
def test_names_that_cannot_name_a_service_are_rejected_at_apply(name):
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": name}, "spec": {}}
    assert any("metadata.name must be a DNS label" in e for e in admission_errors(obj))


@pytest.mark.parametrize(("spec", "message"), BAD, ids=[m for _, m in BAD])
def test_the_operator_refuses_what_admission_refuses(spec, message):
    """Where no CEL or schema runs (an old API server, an emulator), the operator's own parse
    refuses the same specs: InvalidSpec, never a Deployment the API server answers with 422."""
    with pytest.raises(reconcile.SpecError):
        reconcile.load("x", spec)


def test_minimal_spec_is_accepted_and_defaulted():
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}}
    assert admission_errors(obj) == []


@pytest.mark.parametrize(("ref", "key"), [
    ({"name": "engine-auth"}, "api-key"),
    ({"name": "engine-auth", "key": "token"}, "token"),
    ({"name": "engine.auth", "key": ".openai_key-1"}, ".openai_key-1"),
])
def test_api_key_secret_ref_is_admitted_and_its_key_defaulted(ref, key):
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": {"auth": {"apiKeySecretRef": ref}}}
    assert admission_errors(obj) == []
    stored = with_defaults(crd_schema(), obj)
    assert stored["spec"]["auth"]["apiKeySecretRef"] == {**ref, "key": key}
    spec = reconcile.load("x", obj["spec"])
    assert (spec.auth.api_key_secret_ref.name, spec.auth.api_key_secret_ref.key) == (
        ref["name"], key)


def test_the_api_key_variable_without_auth_is_the_users_own():
    """Only the combination is refused: an env entry alone is a plain variable."""
    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"},
           "spec": {"env": [{"name": "TOKENMILL_API_KEY", "valueFrom": {
               "secretKeyRef": {"name": "s", "key": "k"}}}]}}
    assert admission_errors(obj) == []
    reconcile.load("x", obj["spec"])


def _spec(spec: dict) -> dict:
    return {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "x"}, "spec": spec}


@pytest.mark.parametrize("uri", ["smollm2-135m-instruc", "llama-3-8b", "Qwen3-8B", "models/x"])
def test_a_bare_model_name_that_is_not_built_in_is_refused_at_apply(uri):
    """A bare name can only be a built-in model: the engine would look for it as a directory
    in the pod's working directory and fail there."""
    (error,) = admission_errors(_spec({"model": {"uri": uri}}))
    assert "model.uri" in error and "smollm2-135m-instruct" in error
    assert "pvc://" in error and "/models/" in error  # the accepted forms
    with pytest.raises(reconcile.SpecError, match="smollm2-135m-instruct"):
        reconcile.load("x", {"model": {"uri": uri}})


def test_the_built_in_names_are_the_engines():
    from tokenmill.engine.models.source import BUILTIN_MODELS as ENGINE_BUILTINS
    from tokenmill.operator.spec import BUILTIN_MODELS

    assert set(BUILTIN_MODELS) == set(ENGINE_BUILTINS)


@pytest.mark.parametrize("uri", ["smollm2-135m-instruct", "/models/llama", "pvc://weights/x"])
def test_built_in_names_paths_and_claims_are_admitted(uri):
    assert admission_errors(_spec({"model": {"uri": uri}})) == []
    reconcile.load("x", {"model": {"uri": uri}})


REMOTE_URIS = [
    "hf://Qwen/Qwen3-0.6B", "hf://Qwen/Qwen3-0.6B@main", "hf://meta-llama/Llama-3.1-8B@v1.0",
    "hf://org_1/name.v2@refs/pr/3", "hf://a/b@0123456789abcdef0123456789abcdef01234567",
    f"hf://{'o' * 96}/{'n' * 96}", "s3://models/llama/8b", "s3://my.bucket-1/a/b/",
    "s3://abc/", "s3://abc", f"s3://{'b' * 63}/x", "s3://models/Llama 3/weights",
]


@pytest.mark.parametrize("uri", REMOTE_URIS)
def test_remote_model_uris_are_admitted(uri):
    assert admission_errors(_spec({"model": {"uri": uri}})) == []
    reconcile.load("x", {"model": {"uri": uri}})


MALFORMED_URIS = [
    "gs://bucket/model", "oci://registry/model:1", "http://example.com/m", "HF://org/name",
    "hf://Qwen3-0.6B",  # no ORG
    "hf://org/name/extra", "hf://org/", "hf://org/name@", "hf://org/na--me", "hf://or..g/name",
    "hf://-org/name", "hf://org/name.", "hf://org/na me", f"hf://{'o' * 97}/name",
    f"hf://org/{'n' * 97}", "hf://org/name@bad rev",
    "s3://Models/x", "s3://ab/x", f"s3://{'b' * 64}/x", "s3://my_bucket/x", "s3://-bucket/x",
    "s3://bucket-/x", "s3://a..b/x", "s3:///x", "s3://",
]


@pytest.mark.parametrize("uri", MALFORMED_URIS)
def test_unknown_schemes_and_malformed_uris_are_refused_with_the_forms(uri):
    """One message per bad URI, naming every accepted form, at apply and in the operator."""
    (error,) = admission_errors(_spec({"model": {"uri": uri}}))
    for form in ("smollm2-135m-instruct", "/models/", "pvc://CLAIM/PATH",
                 "hf://ORG/NAME[@REVISION]", "s3://BUCKET/PREFIX"):
        assert form in error
    with pytest.raises(reconcile.SpecError, match=re.escape("hf://ORG/NAME[@REVISION]")):
        reconcile.load("x", {"model": {"uri": uri}})


@pytest.mark.parametrize("model", [
    {"uri": "hf://Qwen/Qwen3-0.6B", "cache": {"pvc": "model-cache"}},
    {"uri": "s3://models/llama", "credentialsSecretRef": {"name": "s3-creds"}},
    {"uri": "s3://models/llama", "cache": {"pvc": "shared"},
     "credentialsSecretRef": {"name": "s3-creds"}},
    {"uri": "hf://Qwen/Qwen3-0.6B", "cache": {}},
])
def test_a_cache_and_credentials_are_admitted_for_remote_models(model):
    assert admission_errors(_spec({"model": model})) == []
    reconcile.load("x", {"model": model})


@pytest.mark.parametrize(("model", "message"), [
    ({"uri": "/models/x", "cache": {"pvc": "c"}}, "model.cache and model.credentialsSecretRef"),
    ({"uri": "pvc://weights/x", "credentialsSecretRef": {"name": "s"}},
     "model.cache and model.credentialsSecretRef"),
    ({"cache": {"pvc": "c"}}, "model.cache and model.credentialsSecretRef"),  # the built-in
    ({"uri": "s3://models/x", "cache": {"pvc": "My_Claim"}}, "spec.model.cache.pvc"),
    ({"uri": "s3://models/x", "cache": {"claim": "c"}}, "spec.model.cache.claim"),
    ({"uri": "s3://models/x", "credentialsSecretRef": {}}, "'name' is a required property"),
    ({"uri": "s3://models/x", "credentialsSecretRef": {"name": "Bad_Secret"}},
     "spec.model.credentialsSecretRef.name"),
])
def test_a_cache_or_credentials_that_cannot_apply_are_refused(model, message):
    errors = admission_errors(_spec({"model": model}))
    assert any(message in e for e in errors), errors
    with pytest.raises(reconcile.SpecError):
        reconcile.load("x", {"model": model})


@pytest.mark.parametrize("resources", [{"cpu": 2}, {"cpu": 2, "memory": 4294967296},
                                       {"cpu": "500m", "memory": "4Gi"}])
def test_quantities_are_int_or_string_as_in_a_pod(resources):
    assert admission_errors(_spec({"resources": {"gpus": 0, **resources}})) == []
    reconcile.load("x", {"resources": {"gpus": 0, **resources}})


@pytest.mark.parametrize("resources", [{"cpu": -2}, {"cpu": "2 cores"}, {"memory": "-1Gi"},
                                       {"cpu": True}])
def test_quantities_that_are_no_quantity_are_refused(resources):
    assert admission_errors(_spec({"resources": resources}))
    with pytest.raises(reconcile.SpecError, match="spec.resources"):
        reconcile.load("x", {"resources": resources})


CLOSED_SETS = [
    ({"engine": {"quantization": "int4"}}, ["none", "int8", "fp8"]),
    ({"engine": {"kvCacheDtype": "fp4"}}, ["auto", "int8", "fp8", "fp8_e5m2"]),
    ({"engine": {"tensorParallelSize": 3}}, ["1", "2", "4", "8"]),
    ({"autoscaling": {"mode": "keda2"}}, ["builtin", "external", "keda"]),
    ({"imagePullPolicy": "Sometimes"}, ["Always", "IfNotPresent", "Never"]),
]


@pytest.mark.parametrize(("spec", "allowed"), CLOSED_SETS, ids=lambda v: str(v))
def test_a_value_outside_a_closed_set_is_one_message_naming_the_allowed(spec, allowed):
    """One bad value, one message: an enum beside a CEL rule on the same field prints both on
    servers where an enum violation does not block CEL, and the placeholder 'some validation
    rules were not checked' where it does (hasBlockingErr)."""
    errors = admission_errors(_spec(spec))
    assert len(errors) == 1, errors
    assert all(value in errors[0] for value in allowed), errors


def _enums(node: dict, where: str) -> list[str]:
    """Paths of the nodes with an enum, not descending into inlined Kubernetes types."""
    found = [where] if "enum" in node else []
    for name, sub in node.get("properties", {}).items():
        if name not in KUBERNETES_TYPED:
            found += _enums(sub, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        found += _enums(node["items"], f"{where}[]")
    return found


def test_our_own_fields_carry_no_enum():
    """A closed set of values is a CEL rule on the field (one message); only the inlined
    Kubernetes types keep their enums."""
    assert _enums(crd_schema()["properties"]["spec"], "spec") == []


KUBERNETES_TYPED = {"tolerations", "affinity", "valueFrom", "podSecurityContext",
                    "containerSecurityContext", "topologySpreadConstraints", "volumes",
                    "volumeMounts"}


def _our_models():
    from tokenmill.operator import spec as spec_module

    seen, todo = [], [spec_module.InferenceServiceSpec, spec_module.InferenceServiceStatus]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo += [t for t in _model_types(field.annotation) if t not in seen]
    return seen


def _model_types(annotation):
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in _model_types(arg)]


def test_every_field_of_our_models_has_a_description():
    """`kubectl explain` shows a field's description; no field of ours says <no description>."""
    missing = [f"{model.__name__}.{name}" for model in _our_models()
               for name, field in model.model_fields.items() if not field.description]
    assert not missing, missing


def test_inlined_kubernetes_types_keep_their_first_level_descriptions():
    spec = crd_schema()["properties"]["spec"]["properties"]
    toleration = spec["tolerations"]["items"]
    assert spec["tolerations"].get("description")
    assert all(sub.get("description") for sub in toleration["properties"].values()), toleration
    for field in ("affinity", "podSecurityContext", "containerSecurityContext"):
        assert spec[field].get("description")
        assert all(sub.get("description") for sub in spec[field]["properties"].values()), field


# kubectl's client-side apply copies the whole object into the
# kubectl.kubernetes.io/last-applied-configuration annotation, and the API server caps an
# object's annotations at 256 KiB in total (apimachinery ValidateAnnotationsSize,
# TotalAnnotationSizeLimitB = 256 * (1 << 10)).
TOTAL_ANNOTATION_SIZE = 256 * (1 << 10)


def test_the_crd_fits_kubectls_last_applied_annotation():
    import json

    key = "kubectl.kubernetes.io/last-applied-configuration"
    applied = json.dumps(yaml.safe_load(CRD_PATH.read_text()), separators=(",", ":"))
    assert len(key) + len(applied) < TOTAL_ANNOTATION_SIZE


# --- the admission model: what the API server reports for one object -----------------------

TOY = {"type": "object", "properties": {"spec": {
    "type": "object",
    "properties": {"mode": {"type": "string", "enum": ["a", "b"]},
                   "name": {"type": "string", "pattern": "^[a-z]+$"},
                   "n": {"type": "integer"}},
    "x-kubernetes-validations": [{"rule": "!has(self.n) || self.n < 10",
                                  "message": "n must be below 10"}]}}}


def test_an_enum_violation_blocks_the_rules_and_says_so():
    """strategy.go hasBlockingErr: an enum (NotSupported), required, maxLength, maxItems,
    maxProperties or type error skips every CEL rule and adds one placeholder error."""
    errors = admission_errors({"spec": {"mode": "c", "n": 11}}, TOY)
    assert len(errors) == 2 and "'c' is not one of ['a', 'b']" in errors[0], errors
    assert errors[1] == SKIPPED_RULES


def test_a_pattern_violation_does_not_block_the_rules():
    """A pattern or minimum error is field.Invalid, not blocking: the rules run as well."""
    errors = admission_errors({"spec": {"name": "A", "n": 11}}, TOY)
    assert len(errors) == 2 and "does not match" in errors[0], errors
    assert errors[1] == "n must be below 10"


def test_unknown_fields_fail_the_request_before_validation():
    """create.go: a strict decoding error is a 400 before the object is validated at all."""
    assert admission_errors({"spec": {"mode": "c", "typo": 1}}, TOY) == ["spec.typo: unknown field"]
