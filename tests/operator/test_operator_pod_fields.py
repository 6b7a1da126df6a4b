"""The pod-level fields a Kubernetes user sets on any workload: image pull secrets, priority and
runtime classes, topology spread, pod labels, and volumes with their mounts. Each lands in the
engine pods; what would collide with the operator's own part of the pod is refused at apply
(CEL) and by the operator's own checks, naming the user's field."""

from __future__ import annotations

import kubernetes_validate
import pytest
from operator_support import admission_errors

from tokenmill.operator import manifests, reconcile
from tokenmill.operator.routing import picker_deployment
from tokenmill.operator.spec import parse
from tokenmill.operator.user_paths import user_message

TEMPLATE = {"name": "chat-template", "configMap": {"name": "templates"}}
CA = {"name": "ca", "secret": {"secretName": "corporate-ca"}}
SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
          "whenUnsatisfiable": "ScheduleAnyway",
          "labelSelector": {"matchLabels": {"tokenmill.io/inferenceservice": "svc"}}}
POD_FIELDS = {
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "priorityClassName": "inference-high",
    "runtimeClassName": "nvidia",
    "topologySpreadConstraints": [SPREAD],
    "podLabels": {"team": "ml", "sidecar.istio.io/inject": "false"},
    "volumes": [TEMPLATE, CA],
    "volumeMounts": [{"name": "chat-template", "mountPath": "/etc/templates", "readOnly": True},
                     {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
}


def admitted(spec: dict) -> list[str]:
    return admission_errors({"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
                             "metadata": {"name": "svc"}, "spec": spec})


def deployment(spec: dict) -> dict:
    return manifests.children("svc", "team", "uid-9", reconcile.load("svc", spec),
                              "tokenmill:1")[0]


def test_pod_fields_are_admitted_and_land_in_the_engine_pods():
    assert admitted(POD_FIELDS) == []
    template = deployment(POD_FIELDS)["spec"]["template"]
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "inference-high"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["topologySpreadConstraints"] == [SPREAD]
    labels = template["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["sidecar.istio.io/inject"] == "false"
    assert labels[manifests.OWNER_LABEL] == "svc"  # the selector's label is still there
    assert pod["volumes"][-2:] == [TEMPLATE, CA]
    assert pod["volumes"][0]["name"] == "scratch"
    mounts = pod["containers"][0]["volumeMounts"]
    assert mounts[0] == {"name": "scratch", "mountPath": "/tmp"}
    assert mounts[-2:] == POD_FIELDS["volumeMounts"]
    kubernetes_validate.validate(deployment(POD_FIELDS), "1.31", strict=True)


def test_without_the_fields_the_pod_has_none_of_them():
    pod = deployment({})["spec"]["template"]["spec"]
    for field in ("imagePullSecrets", "priorityClassName", "runtimeClassName",
                  "topologySpreadConstraints"):
        assert field not in pod
    assert [v["name"] for v in pod["volumes"]] == ["scratch"]


def test_image_pull_secrets_reach_the_download_and_the_endpoint_picker():
    """Pull secrets are the pod's, so the init container pulling the same image has them; the
    picker's image may come from the same private mirror."""
    spec = {**POD_FIELDS, "model": {"uri": "hf://org/model"},
            "routing": {"inferencePool": {}}}
    pod = deployment(spec)["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == manifests.MODEL_DOWNLOAD
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    picker = picker_deployment("svc", "team", "uid-9", reconcile.load("svc", spec))
    assert picker["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "registry-credentials"}]
    plain = picker_deployment("svc", "team", "uid-9",
                              reconcile.load("svc", {"routing": {"inferencePool": {}}}))
    assert "imagePullSecrets" not in plain["spec"]["template"]["spec"]


def test_a_mount_at_dev_shm_takes_the_place_of_the_operators():
    """vLLM's manifests mount a memory-backed /dev/shm of their own size; with tensor
    parallelism the operator mounts one too, and two mounts at one path are refused."""
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    spec = {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 2},
            "volumes": [shm], "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
    assert admitted(spec) == []
    pod = deployment(spec)["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["scratch", "shm"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts].count("/dev/shm") == 1
    assert {"name": "shm", "mountPath": "/dev/shm"} in mounts
    without = deployment({k: v for k, v in spec.items() if k.startswith(("model", "engine"))})
    assert "dshm" in [v["name"] for v in without["spec"]["template"]["spec"]["volumes"]]


def test_a_mount_at_tmp_replaces_the_scratch_the_download_keeps_it():
    scratch = {"name": "big-scratch", "emptyDir": {"sizeLimit": "50Gi"}}
    spec = {"model": {"uri": "hf://org/model"}, "volumes": [scratch],
            "volumeMounts": [{"name": "big-scratch", "mountPath": "/tmp"}]}
    pod = deployment(spec)["spec"]["template"]["spec"]
    engine = pod["containers"][0]["volumeMounts"]
    assert [m for m in engine if m["mountPath"] == "/tmp"] == [
        {"name": "big-scratch", "mountPath": "/tmp"}]
    download = pod["initContainers"][0]["volumeMounts"]
    assert {"name": "scratch", "mountPath": "/tmp"} in download
    kubernetes_validate.validate(deployment(spec), "1.31", strict=True)


MOUNT_A = {"volumes": [TEMPLATE]}
REFUSED = [
    ({"volumes": [{"name": "scratch", "emptyDir": {}}]},
     "volumes[].name must not be one of the operator's own volumes",
     "spec.volumes[0].name: 'scratch' is the operator's"),
    ({"volumes": [{"name": "adapters-0", "emptyDir": {}}]},
     "volumes[].name must not be one of the operator's own volumes",
     "spec.volumes[0].name: 'adapters-0' is the operator's"),
    ({**MOUNT_A, "volumeMounts": [{"name": "chat-template", "mountPath": "/mnt/models"}]},
     "volumeMounts[].mountPath must not be /mnt/models",
     "spec.volumeMounts[0].mountPath: '/mnt/models'"),
    ({**MOUNT_A, "volumeMounts": [{"name": "chat-template", "mountPath": "/model-cache/x"}]},
     "volumeMounts[].mountPath must not be /mnt/models, /model-cache",
     "spec.volumeMounts[0].mountPath: '/model-cache/x'"),
    ({**MOUNT_A, "volumeMounts": [{"name": "templates", "mountPath": "/etc/t"}]},
     "volumeMounts[].name must be the name of one of spec.volumes",
     "spec.volumeMounts[0].name: 'templates'"),
    ({"volumeMounts": [{"name": "scratch", "mountPath": "/etc/t"}]},
     "volumeMounts[].name must be the name of one of spec.volumes",
     "spec.volumeMounts[0].name: 'scratch'"),
    ({"podLabels": {"tokenmill.io/inferenceservice": "other"}},
     "podLabels must not set the operator's own labels",
     "spec.podLabels: tokenmill.io/inferenceservice"),
    ({"podLabels": {"app.kubernetes.io/name": "x"}},
     "podLabels must not set the operator's own labels", "spec.podLabels"),
    ({"podLabels": {"bad key": "x"}}, "every podLabels key must be a Kubernetes qualified name",
     "spec.podLabels"),
    ({"podLabels": {"team": "not a label value"}}, "spec.podLabels.team", "spec.podLabels.team"),
    ({"priorityClassName": "High_Priority"}, "spec.priorityClassName",
     "spec.priorityClassName"),
    ({"runtimeClassName": "nvidia runtime"}, "spec.runtimeClassName", "spec.runtimeClassName"),
    ({"imagePullSecrets": [{"name": "Registry_Credentials"}]}, "spec.imagePullSecrets",
     "spec.imagePullSecrets"),
    ({"volumes": [TEMPLATE, {**CA, "name": "chat-template"}]}, "spec.volumes[1]: Duplicate value",
     "spec.volumes[1].name: 'chat-template' is given twice (also spec.volumes[0].name)"),
    ({**MOUNT_A, "volumeMounts": [{"name": "chat-template", "mountPath": "/etc/t"},
                                  {"name": "chat-template", "mountPath": "/etc/t"}]},
     "spec.volumeMounts[1]: Duplicate value",
     "spec.volumeMounts[1].mountPath: '/etc/t' is given twice"),
]


@pytest.mark.parametrize(("spec", "admission", "operator"), REFUSED,
                         ids=[o for _, _, o in REFUSED])
def test_what_collides_with_the_operators_pod_is_refused_at_apply_and_by_the_operator(
        spec, admission, operator):
    """The CEL rule at `kubectl apply`; the operator's own check where no CEL runs (an older
    API server, an emulator), both in the user's fields."""
    errors = admitted(spec)
    assert any(admission in e for e in errors), errors
    with pytest.raises(reconcile.SpecError) as refused:
        reconcile.load("svc", spec)
    assert operator in str(refused.value)


@pytest.mark.parametrize(("spec", "message"), [
    ({"topologySpreadConstraints": [{"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
     "'maxSkew' is a required property"),
    ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "Later"}]},
     "spec.topologySpreadConstraints.0.whenUnsatisfiable"),
    ({"volumes": [{"name": "x", "configMapp": {"name": "t"}}]},
     "spec.volumes.0.configMapp: unknown field"),
    ({**MOUNT_A, "volumeMounts": [{"name": "chat-template"}]},
     "'mountPath' is a required property"),
    ({"volumes": [{"name": "x" * 64, "emptyDir": {}}]}, "spec.volumes.0.name"),
])
def test_kubernetes_typed_pod_fields_are_checked_against_kubernetes_schema(spec, message):
    errors = admitted(spec)
    assert any(message in e for e in errors), errors


def test_api_server_messages_about_the_users_volumes_name_the_users_fields():
    spec = parse({**POD_FIELDS, "engine": {"tensorParallelSize": 2},
                  "model": {"uri": "/models/llama"}})
    volumes, mounts = manifests.user_volume_offsets(spec)
    assert (volumes, mounts) == (2, 2)  # scratch and dshm come first
    message = ("Deployment.apps \"svc\" is invalid: [spec.template.spec.volumes[3].secret."
               "secretName: Required value, spec.template.spec.containers[0].volumeMounts[2]."
               "mountPath: Invalid value: \"x\", spec.template.spec.volumes[0].name: Invalid, "
               "spec.template.spec.runtimeClassName: Invalid value: \"a\", "
               "spec.template.spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0]")
    out = user_message(message, spec)
    assert "spec.volumes[1].secret.secretName: Required value" in out
    assert "spec.volumeMounts[0].mountPath: Invalid value" in out
    assert "spec.template.spec.volumes[0].name" in out  # the operator's own: not mapped
    assert "spec.runtimeClassName: Invalid value" in out
    assert "spec.topologySpreadConstraints[0].maxSkew" in out
