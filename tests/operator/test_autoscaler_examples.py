"""The external-autoscaler example: an InferenceService the API server accepts in mode external,
and a KEDA ScaledObject that targets it (not its Deployment) on the engines' queue gauge."""

from __future__ import annotations

import yaml
from operator_support import REPO, admission_errors

from tokenmill.operator import manifests
from tokenmill.operator.reconcile import load
from tokenmill.operator.scraper import WAITING

KEDA = REPO / "examples" / "keda" / "smollm2-keda.yaml"


def test_keda_example_targets_the_inference_service_scale_subresource():
    isvc, scaled = yaml.safe_load_all(KEDA.read_text())
    assert admission_errors(isvc) == []
    spec = load(isvc["metadata"]["name"], isvc["spec"])
    assert spec.autoscaling.mode == "external"
    # The operator takes spec.replicas as written: whatever KEDA sets reaches the Deployment.
    spec.replicas = 7
    deployment = manifests.deployment("smollm2", "default", "uid", spec, "img")
    assert deployment["spec"]["replicas"] == 7

    assert scaled["kind"] == "ScaledObject" and scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
        "name": isvc["metadata"]["name"]}
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert WAITING in query and f'model_name="{isvc["metadata"]["name"]}"' in query
    # KEDA scales a target in the ScaledObject's own namespace: both go where `kubectl apply -n`
    # puts them, so neither names one, and the query names none either.
    assert "namespace" not in isvc["metadata"] and "namespace" not in scaled["metadata"]
    assert "namespace=" not in query
