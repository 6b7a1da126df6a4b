"""The operator against API servers older than the Kubernetes schemas its CRD inlines, and
against the API server's own words: 299 warnings, messages with Go pointers, paths of the
Deployment rather than of the InferenceService."""

from __future__ import annotations

import asyncio
import copy
import itertools

import pytest
from apiserver_model.versions import drop_unknown, warning_header
from operator_support import IS_PATH, inference_service, running_operator

from tokenmill.operator import manifests
from tokenmill.operator.kube import parse_warnings
from tokenmill.operator.reconcile import absent, path_text, without
from tokenmill.operator.spec import parse

NS = "default"
ISVCS = IS_PATH.format(ns=NS)
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/chat"
APPARMOR = {"appArmorProfile": {"type": "RuntimeDefault"}}
TERM = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname",
        "matchLabelKeys": ["pod-template-hash"]}
ANTI_AFFINITY = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}
TERM_PATH = "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"


def condition(isvc: dict | None, type_: str) -> dict:
    conds = ((isvc or {}).get("status") or {}).get("conditions", [])
    return next((c for c in conds if c["type"] == type_), {})


async def _with(k, path, predicate):
    obj = await k.get(path)
    return obj if obj is not None and predicate(obj) else None


async def _events(k, reason):
    return [e for e in await k.events() if e["reason"] == reason]


def deployment_writes(k) -> int:
    return sum(1 for group, resource, verb in k.calls
               if (group, resource) == ("apps", "deployments") and verb in ("create", "patch"))


# --- the model of an older server ----------------------------------------------------------

def test_an_older_server_drops_what_it_does_not_know_and_warns():
    spec = parse(copy.deepcopy({"resources": {"gpus": 0}, "podSecurityContext": APPARMOR,
                                "containerSecurityContext": APPARMOR, "affinity": ANTI_AFFINITY}))
    obj = copy.deepcopy(manifests.deployment("a", "ns", "u", spec, "img"))
    assert drop_unknown(obj, 28) == [
        'unknown field "spec.template.spec.securityContext.appArmorProfile"',
        'unknown field "spec.template.spec.containers[0].securityContext.appArmorProfile"',
        f'unknown field "spec.template.spec.{TERM_PATH}.matchLabelKeys"']
    pod = obj["spec"]["template"]["spec"]
    assert "appArmorProfile" not in pod["securityContext"]
    assert "matchLabelKeys" not in pod["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"][0]
    # 1.29 and 1.30 know matchLabelKeys but keep it only from 1.31 (feature gate): no warning.
    obj = copy.deepcopy(manifests.deployment("a", "ns", "u", spec, "img"))
    assert drop_unknown(obj, 30) == []
    assert "appArmorProfile" in obj["spec"]["template"]["spec"]["securityContext"]
    assert "matchLabelKeys" not in obj["spec"]["template"]["spec"]["affinity"][
        "podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert drop_unknown(copy.deepcopy(manifests.deployment("a", "ns", "u", spec, "img")), 31) == []


def test_warning_headers_round_trip():
    """The header as NewWarningHeader writes it, read back as ParseWarningHeader reads it."""
    texts = ['unknown field "spec.x"', 'a \\ backslash, and a comma']
    assert parse_warnings([warning_header(t) for t in texts]) == texts
    assert parse_warnings([", ".join(warning_header(t) for t in texts)]) == texts
    assert parse_warnings(['299 - "deprecated" "Wed, 21 Oct 2015 07:28:00 GMT"']) == [
        "deprecated"]
    assert parse_warnings(["garbage"]) == []


# --- version skew --------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_a_field_the_server_drops_is_reported_once_and_not_patched_again(tmp_path):
    env = {"TOKENMILL_RESYNC_SECONDS": "1"}
    async with running_operator(tmp_path, env=env, minor=28) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "affinity": ANTI_AFFINITY}))
        field = f"spec.{TERM_PATH}.matchLabelKeys"
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Degraded").get("reason")
            == "FieldsDropped"))
        message = condition(isvc, "Degraded")["message"]
        assert field in message and "v1.28" in message
        (warning,) = await k.eventually(lambda: _events(k, "APIServerWarning"))
        assert warning["type"] == "Warning"
        assert f'unknown field "{field}"' in warning["message"]
        assert "spec.template" not in warning["message"]
        writes = deployment_writes(k)
        await asyncio.sleep(3)  # resyncs and the watch events of the operator's own writes
        assert deployment_writes(k) == writes
        assert await _events(k, "Updated") == []
        assert len(await _events(k, "APIServerWarning")) == 1
        # The rest of the spec is deployed; the term lacks only the dropped field.
        term = (await k.get(DEPLOY))["spec"]["template"]["spec"]["affinity"][
            "podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term == {k_: v for k_, v in TERM.items() if k_ != "matchLabelKeys"}


@pytest.mark.asyncio
async def test_a_field_dropped_without_a_warning_is_still_reported(tmp_path):
    """On 1.29 and 1.30 matchLabelKeys exists behind a disabled feature gate: dropped silently."""
    async with running_operator(tmp_path, env={"TOKENMILL_RESYNC_SECONDS": "1"}, minor=30) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "affinity": ANTI_AFFINITY}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Degraded").get("reason")
            == "FieldsDropped"))
        assert f"spec.{TERM_PATH}.matchLabelKeys" in condition(isvc, "Degraded")["message"]
        writes = deployment_writes(k)
        await asyncio.sleep(3)
        assert deployment_writes(k) == writes
        assert await _events(k, "APIServerWarning") == []


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["podSecurityContext", "containerSecurityContext"])
async def test_apparmor_below_1_30_is_refused(tmp_path, field):
    """Dropping appArmorProfile would run the pods without the profile the spec asks for."""
    async with running_operator(tmp_path, minor=28) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, field: APPARMOR}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        message = condition(isvc, "Ready")["message"]
        assert f"spec.{field}.appArmorProfile" in message
        assert "1.30" in message and "v1.28" in message
        assert await k.get(DEPLOY) is None


@pytest.mark.asyncio
async def test_recursive_read_only_mounts_below_1_31_are_refused(tmp_path):
    """Gated off before 1.31, recursiveReadOnly would be dropped silently and the submounts of
    a read-only mount left writable."""
    mount = {"name": "data", "mountPath": "/data", "readOnly": True,
             "recursiveReadOnly": "Enabled"}
    async with running_operator(tmp_path, minor=30) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "volumes": [{"name": "data", "emptyDir": {}}],
            "volumeMounts": [{"name": "data", "mountPath": "/etc/x"}, mount]}))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        message = condition(isvc, "Ready")["message"]
        assert "spec.volumeMounts[1].recursiveReadOnly: needs Kubernetes v1.31" in message
        assert "v1.30" in message
        assert await k.get(DEPLOY) is None


@pytest.mark.asyncio
async def test_apparmor_from_1_30_is_deployed_quietly(tmp_path):
    async with running_operator(tmp_path, env={"TOKENMILL_RESYNC_SECONDS": "1"}, minor=30) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "podSecurityContext": APPARMOR}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        assert deployment["spec"]["template"]["spec"]["securityContext"]["appArmorProfile"] == (
            APPARMOR["appArmorProfile"])
        await asyncio.sleep(2)
        assert deployment_writes(k) == 1
        isvc = await k.get(f"{ISVCS}/chat")
        assert condition(isvc, "Degraded")["status"] == "False"


# --- messages with Go pointers and the Deployment's paths ----------------------------------

_addresses = itertools.count(0xC00A0EAE70, 0x40)


def privileged_refusal() -> str:
    """The Deployment API's answer (ValidateSecurityContext; field.Invalid with the struct, so
    its pointer fields print as fresh addresses on every call)."""
    a = [hex(next(_addresses)) for _ in range(4)]
    return (f'Deployment.apps "chat" is invalid: spec.template.spec.containers[0].'
            f"securityContext: Invalid value: core.SecurityContext{{Capabilities:"
            f"(*core.Capabilities)({a[0]}), Privileged:(*bool)({a[1]}), SELinuxOptions:"
            f"(*core.SELinuxOptions)(nil), WindowsOptions:(*core.WindowsSecurityContextOptions)"
            f"(nil), RunAsUser:(*int64)(nil), RunAsGroup:(*int64)(nil), RunAsNonRoot:(*bool)(nil),"
            f" ReadOnlyRootFilesystem:(*bool)({a[2]}), AllowPrivilegeEscalation:(*bool)({a[3]}), "
            f"ProcMount:(*core.ProcMountType)(nil), SeccompProfile:(*core.SeccompProfile)(nil), "
            f"AppArmorProfile:(*core.AppArmorProfile)(nil)}}: cannot set "
            f"`allowPrivilegeEscalation` to false and `privileged` to true")


@pytest.mark.asyncio
async def test_a_refusal_with_go_pointers_is_posted_once(tmp_path):
    refuse = {("deployments", "create"): (422, privileged_refusal)}
    env = {"TOKENMILL_RESYNC_SECONDS": "1"}
    async with running_operator(tmp_path, env=env, refuse=refuse) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0},
            "containerSecurityContext": {"privileged": True, "allowPrivilegeEscalation": False}}))
        (event,) = await k.eventually(lambda: _events(k, "InvalidSpec"))
        await asyncio.sleep(3)  # three resyncs, each refused with other addresses
        assert len(await _events(k, "InvalidSpec")) == 1
        assert "0xc" not in event["message"] and "core.SecurityContext" not in event["message"]
        assert ('spec.containerSecurityContext: Invalid value: {"allowPrivilegeEscalation":false,'
                '"privileged":true}') in event["message"]


@pytest.mark.asyncio
async def test_privileged_is_not_contradicted_by_the_operators_default(tmp_path):
    """privileged implies privilege escalation: the operator's allowPrivilegeEscalation: false
    default would make the Deployment API refuse a field the user never set."""
    async with running_operator(tmp_path) as k:
        await k.request("POST", ISVCS, inference_service("chat", {
            "resources": {"gpus": 0}, "containerSecurityContext": {"privileged": True}}))
        deployment = await k.eventually(lambda: k.get(DEPLOY))
        sc = deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert sc["privileged"] is True and "allowPrivilegeEscalation" not in sc
        assert sc["capabilities"] == {"drop": ["ALL"]}


ENV_REFUSAL = ('Deployment.apps "chat" is invalid: spec.template.spec.containers[0].env[{i}]'
               '.valueFrom.fieldRef.fieldPath: Unsupported value: "metadata.foo": supported '
               'values: "metadata.name", "metadata.namespace", "metadata.uid"')


@pytest.mark.asyncio
async def test_a_refusal_names_the_users_field(tmp_path):
    spec = {"resources": {"gpus": 0},
            "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.foo"}}}]}
    offset = manifests.user_env_offset(parse(spec))
    refuse = {("deployments", "create"): (422, ENV_REFUSAL.format(i=offset))}
    async with running_operator(tmp_path, refuse=refuse) as k:
        await k.request("POST", ISVCS, inference_service("chat", spec))
        isvc = await k.eventually(lambda: _with(
            k, f"{ISVCS}/chat", lambda o: condition(o, "Ready").get("reason") == "InvalidSpec"))
        message = condition(isvc, "Ready")["message"]
        assert 'spec.env[0].valueFrom.fieldRef.fieldPath: Unsupported value: "metadata.foo"' in (
            message)
        assert "containers[0]" not in message


def test_what_a_write_did_not_keep():
    """A key the stored object lacks is dropped; an empty value is Go's omitempty, not a drop."""
    desired = {"spec": {"a": 1, "b": {"c": "x", "d": ""}, "l": [{"e": 1}, {"f": 2}]}}
    live = {"spec": {"a": 1, "b": {}, "l": [{"e": 1}, {}], "extra": 3}}
    assert absent(live, desired) == [["spec", "b", "c"], ["spec", "l", 1, "f"]]
    assert path_text(["spec", "l", 1, "f"]) == "spec.l[1].f"
    assert without(desired, absent(live, desired)) == {
        "spec": {"a": 1, "b": {"d": ""}, "l": [{"e": 1}, {}]}}
