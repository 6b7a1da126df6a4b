"""The API server's messages about a child, rewritten to name the InferenceService's fields.

The messages are the real ones: paths as k8s.io/apimachinery field.Path prints them
(`a.b[0].c`, map keys in brackets), bodies as field.Error.ErrorBody formats them (a string
quoted, a struct through `%#v`, a pointer dereferenced so its fields print as Go pointers), and
the rules from pkg/apis/core/validation/validation.go (ValidateTolerations,
ValidateSecurityContext, validateEnvVarValueFrom).
"""

from __future__ import annotations

import re

import pytest

from tokenmill.operator import manifests
from tokenmill.operator.spec import parse
from tokenmill.operator.user_paths import stable, user_message, user_path

TOLERATION_DUMP = ('core.Toleration{Key:"gpu", Operator:"Exists", Value:"x", Effect:"", '
                   'TolerationSeconds:(*int64)(nil)}')
SC_DUMP = ("core.SecurityContext{Capabilities:(*core.Capabilities)(0xc00a0eae70), "
           "Privileged:(*bool)(0xc00a0eae88), SELinuxOptions:(*core.SELinuxOptions)(nil), "
           "WindowsOptions:(*core.WindowsSecurityContextOptions)(nil), RunAsUser:(*int64)(nil), "
           "RunAsGroup:(*int64)(nil), RunAsNonRoot:(*bool)(nil), "
           "ReadOnlyRootFilesystem:(*bool)(0xc00a0eae89), "
           "AllowPrivilegeEscalation:(*bool)(0xc00a0eae8a), ProcMount:(*core.ProcMountType)(nil), "
           "SeccompProfile:(*core.SeccompProfile)(nil), "
           "AppArmorProfile:(*core.AppArmorProfile)(nil)}")
PRIVILEGED = ("cannot set `allowPrivilegeEscalation` to false and `privileged` to true")


def spec(**fields):
    return parse({"resources": {"gpus": 0}, **fields})


def test_the_env_offset_comes_from_the_manifest():
    """The operator's own variables come first; how many depends on the spec."""
    plain = spec(env=[{"name": "A", "value": "1"}])
    keyed = spec(env=[{"name": "A", "value": "1"}], auth={"apiKeySecretRef": {"name": "s"}})
    overriding = spec(env=[{"name": "HOME", "value": "/data"}, {"name": "A", "value": "1"}])
    for s in (plain, keyed, overriding):
        env = manifests.deployment("a", "ns", "u", s, "img")["spec"]["template"]["spec"][
            "containers"][0]["env"]
        offset = manifests.user_env_offset(s)
        assert env[offset:] == [e.model_dump(by_alias=True, exclude_none=True) for e in s.env]
        last = len(env) - 1
        assert user_path(f"spec.template.spec.containers[0].env[{last}].name", s) == (
            f"spec.env[{len(s.env) - 1}].name")
    assert user_path("spec.template.spec.containers[0].env[0]", plain) is None  # HOME: ours


@pytest.mark.parametrize(("deployment_path", "expected"), [
    ("spec.template.spec.tolerations[2].effect", "spec.tolerations[2].effect"),
    ("spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
     "[0].matchLabelKeys", "spec.affinity.podAntiAffinity."
     "requiredDuringSchedulingIgnoredDuringExecution[0].matchLabelKeys"),
    ("spec.template.spec.nodeSelector", "spec.nodeSelector"),
    ("spec.template.spec.securityContext.appArmorProfile",
     "spec.podSecurityContext.appArmorProfile"),
    ("spec.template.spec.containers[0].securityContext.capabilities.add[0]",
     "spec.containerSecurityContext.capabilities.add[0]"),
    ("spec.template.spec.containers[0].image", "spec.image"),
    ("spec.template.spec.containers[0].imagePullPolicy", "spec.imagePullPolicy"),
    ("spec.template.spec.containers[0].resources.requests[cpu]", "spec.resources.cpu"),
    ("spec.template.spec.containers[0].resources.limits[memory]", "spec.resources.memory"),
    ("spec.template.spec.containers[0].resources.limits[vendor.com/gpu]", "spec.resources.gpus"),
    ("spec.template.spec.serviceAccountName", "spec.serviceAccountName"),
    ("spec.template.metadata.annotations", "spec.podAnnotations"),
    ("spec.template.spec.containers[0].command", None),  # built from several fields
    ("spec.template.spec.volumes[0]", None),
])
def test_deployment_paths_map_to_the_spec(deployment_path, expected):
    s = spec(resources={"gpus": 1, "gpuResourceName": "vendor.com/gpu"})
    assert user_path(deployment_path, s) == expected


def test_a_toleration_dump_becomes_the_users_toleration():
    s = spec(tolerations=[{"key": "gpu", "operator": "Exists", "value": "x"}])
    message = (f'Deployment.apps "a" is invalid: spec.template.spec.tolerations[0].operator: '
               f"Invalid value: {TOLERATION_DUMP}: value must be empty when `operator` is "
               f"'Exists'")
    assert user_message(message, s) == (
        'Deployment.apps "a" is invalid: spec.tolerations[0].operator: Invalid value: '
        '{"key":"gpu","operator":"Exists","value":"x"}: value must be empty when `operator` is '
        "'Exists'")


def test_a_security_context_dump_loses_its_pointers():
    s = spec(containerSecurityContext={"privileged": True, "allowPrivilegeEscalation": False})
    message = (f'Deployment.apps "a" is invalid: spec.template.spec.containers[0].'
               f"securityContext: Invalid value: {SC_DUMP}: {PRIVILEGED}")
    assert user_message(message, s) == (
        'Deployment.apps "a" is invalid: spec.containerSecurityContext: Invalid value: '
        f'{{"allowPrivilegeEscalation":false,"privileged":true}}: {PRIVILEGED}')


def test_an_env_error_names_the_users_variable():
    s = spec(env=[{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.foo"}}}])
    offset = manifests.user_env_offset(s)
    message = (f'Deployment.apps "a" is invalid: spec.template.spec.containers[0].env[{offset}]'
               '.valueFrom.fieldRef.fieldPath: Unsupported value: "metadata.foo": supported '
               'values: "metadata.name", "metadata.namespace", "metadata.uid"')
    assert user_message(message, s) == (
        'Deployment.apps "a" is invalid: spec.env[0].valueFrom.fieldRef.fieldPath: Unsupported '
        'value: "metadata.foo": supported values: "metadata.name", "metadata.namespace", '
        '"metadata.uid"')


def test_several_errors_and_unmapped_paths():
    s = spec(tolerations=[{"key": "gpu", "operator": "Exists", "value": "x"}],
             image="reg/img:1")
    message = ('Deployment.apps "a" is invalid: [spec.template.spec.containers[0].image: '
               'Required value, spec.template.spec.volumes[1].name: Duplicate value: "scratch", '
               f"spec.template.spec.tolerations[0].operator: Invalid value: {TOLERATION_DUMP}: "
               "value must be empty when `operator` is 'Exists']")
    out = user_message(message, s)
    assert "spec.image: Required value" in out
    assert 'spec.template.spec.volumes[1].name: Duplicate value: "scratch"' in out
    assert 'spec.tolerations[0].operator: Invalid value: {"key":"gpu"' in out
    assert "core.Toleration" not in out


def test_an_unknown_field_warning_names_the_users_field():
    s = spec(podSecurityContext={"appArmorProfile": {"type": "RuntimeDefault"}})
    warning = 'unknown field "spec.template.spec.securityContext.appArmorProfile"'
    assert user_message(warning, s) == 'unknown field "spec.podSecurityContext.appArmorProfile"'


def test_a_dump_of_an_unmapped_field_is_dropped_and_pointers_never_stay():
    message = ("spec.template.spec.volumes[0]: Invalid value: core.Volume{Name:\"x\", "
               "VolumeSource:core.VolumeSource{EmptyDir:(*core.EmptyDirVolumeSource)"
               "(0xc000123456)}}: bad")
    out = user_message(message, spec())
    assert not re.search(r"0x[0-9a-f]+", out) and "core.Volume{" not in out
    assert out.startswith("spec.template.spec.volumes[0]: Invalid value: ") and out.endswith(
        ": bad")


def test_stable_is_the_same_for_two_answers_that_differ_only_in_pointers():
    other = SC_DUMP.replace("0xc00a0eae", "0xc00b1f00")
    assert stable(f"x: Invalid value: {SC_DUMP}: y") == stable(f"x: Invalid value: {other}: y")
    assert stable("no pointers here") == "no pointers here"
