"""Engine pods run in a namespace that enforces Pod Security Standards `restricted`, by default
and with the spec's overrides; an override that breaks the profile is visible as such."""

from __future__ import annotations

import os

import pytest
import yaml
from openshift_scc import id_violations
from operator_support import EXAMPLES
from psa_restricted import violations

from tokenmill.operator import manifests
from tokenmill.operator.reconcile import load


def template(spec: dict) -> dict:
    deployment = manifests.deployment("svc", "team", "uid-1", load("svc", spec), "tokenmill:1")
    return deployment["spec"]["template"]


SPECS = [{}, {"resources": {"gpus": 0}}, {"model": {"uri": "pvc://models/llama"}},
         {"podSecurityContext": {"runAsUser": 4242, "fsGroup": 4242}},
         {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 4}},
         {"model": {"uri": "hf://Qwen/Qwen3-0.6B"}},
         {"model": {"uri": "s3://models/llama", "cache": {"pvc": "shared"},
                    "credentialsSecretRef": {"name": "creds"}}},
         *[yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES]]


@pytest.mark.parametrize("spec", SPECS)
def test_engine_pods_pass_the_restricted_profile(spec):
    t = template(spec)
    assert violations(t["spec"], t["metadata"].get("annotations")) == []


@pytest.mark.parametrize("spec", SPECS)
def test_with_platform_assigned_ids_engine_pods_pass_openshifts_restricted_v2(spec,
                                                                             monkeypatch):
    """The image's user id (1000) is outside any OpenShift namespace's range: restricted-v2
    refused every engine pod. With `tokenmill operator --platform-assigned-ids` the pod names
    no ids (the spec's own overrides still apply) and still passes the restricted profile."""
    assert any("runAsUser 1000 must be in the ranges" in v
               for v in id_violations(template(spec)["spec"])) or "podSecurityContext" in spec
    monkeypatch.setenv(manifests.PLATFORM_ASSIGNED_IDS_ENV, "1")
    t = template(spec)
    context = t["spec"]["securityContext"]
    assert context["runAsNonRoot"] is True
    if "podSecurityContext" in spec:
        assert context["runAsUser"] == spec["podSecurityContext"]["runAsUser"]
    else:
        assert not set(context) & set(manifests.ASSIGNED_IDS)
        assert id_violations(t["spec"]) == []
    assert violations(t["spec"], t["metadata"].get("annotations")) == []


def test_the_root_filesystem_is_read_only_with_a_writable_scratch():
    t = template({})
    (c,) = t["spec"]["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "scratch", "mountPath": "/tmp"} in c["volumeMounts"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["HOME"] == "/tmp"
    assert all(env[k].startswith("/tmp/") for k in ("XDG_CACHE_HOME", "TRITON_CACHE_DIR",
                                                    "HF_HOME"))
    assert t["spec"]["securityContext"]["fsGroup"] == manifests.ENGINE_UID


@pytest.mark.parametrize(("override", "violation"), [
    ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot != true"),
    ({"podSecurityContext": {"runAsUser": 0}}, "runAsUser=0 (pod)"),
    ({"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}, "seccompProfile"),
    ({"containerSecurityContext": {"allowPrivilegeEscalation": True}},
     "allowPrivilegeEscalation"),
    ({"containerSecurityContext": {"privileged": True}}, "privileged"),
    ({"containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
     "capabilities must drop ALL"),
    ({"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
     "non-default capabilities"),
])
def test_overrides_replace_the_defaults_field_by_field(override, violation):
    """The spec may loosen the defaults (a cluster without PSA); the profile then says so."""
    t = template(override)
    assert any(violation in v for v in violations(t["spec"]))


def test_adding_a_capability_keeps_dropping_all_the_others():
    """`add` alone is merged with the default `drop: [ALL]`: replacing the whole capabilities
    field dropped it, and the restricted profile then refused pods it allows."""
    t = template({"containerSecurityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}})
    (c,) = t["spec"]["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert violations(t["spec"]) == []


def test_the_download_runs_under_the_engines_overrides_too():
    """The init container is one more container of the pod: the spec's container security
    context applies to it as to the engine, so a loosened profile shows on both."""
    t = template({"model": {"uri": "s3://models/llama"},
                  "containerSecurityContext": {"allowPrivilegeEscalation": True}})
    found = violations(t["spec"])
    assert "allowPrivilegeEscalation != false (model-download)" in found
    assert "allowPrivilegeEscalation != false (engine)" in found


def test_the_operators_flags_reach_the_manifests(monkeypatch):
    """`tokenmill operator --platform-assigned-ids --cluster-domain D`, as the chart passes
    them: each becomes the variable the manifests and the status read."""
    from tokenmill.operator.__main__ import export_settings, parser

    for name in (manifests.PLATFORM_ASSIGNED_IDS_ENV, "TOKENMILL_CLUSTER_DOMAIN"):
        monkeypatch.setenv(name, "")  # recorded, so that what the flags set is undone
        monkeypatch.delenv(name)
    assert template({})["spec"]["securityContext"]["runAsUser"] == manifests.ENGINE_UID
    export_settings(parser().parse_args(["--platform-assigned-ids",
                                         "--cluster-domain", "k8s.corp"]))
    assert "runAsUser" not in template({})["spec"]["securityContext"]
    assert os.environ["TOKENMILL_CLUSTER_DOMAIN"] == "k8s.corp"
