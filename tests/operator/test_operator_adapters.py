"""spec.adapters: LoRA adapters from the model's sources, refused at apply (the CRD's schema and
CEL rules) and by the operator with messages naming the entry; rendered as the engine's own
--enable-lora/--lora-modules flags, fetched by the model's init container, mounted from their
claims; and reported per adapter in status.adapters (Loaded from the engines' /metrics, Failed
from an engine's termination message, Pending otherwise)."""

from __future__ import annotations

import asyncio

import aiohttp
import kubernetes_validate
import pytest
from aiohttp import web
from operator_support import (
    IS_PATH,
    admission_errors,
    crd_schema,
    granted,
    http_server,
    inference_service,
    pod_template,
    render_chart,
    running_operator,
    served_config,
)
from process_support import free_port
from prometheus_client import CollectorRegistry, Gauge, Info, generate_latest

from tokenmill.engine.contract.lora import MAX_LORA_RANK, NAME_PATTERN, LoRAModule
from tokenmill.operator import manifests, status
from tokenmill.operator.pods import adapter_failures
from tokenmill.operator.reconcile import load
from tokenmill.operator.scraper import ADAPTER_INFO, loaded_adapters, parse_adapters
from tokenmill.operator.spec import MAX_ADAPTERS, SpecError

HF = {"name": "sql", "uri": "hf://acme/llama-sql-lora@v2"}
S3 = {"name": "support", "uri": "s3://adapters/llama/support"}
PVC = {"name": "legal", "uri": "pvc://adapters/legal"}
THREE = [HF, S3, PVC]


def _obj(spec: dict, name: str = "chat") -> dict:
    return {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name}, "spec": spec}


def _spec(adapters: list[dict], **rest) -> dict:
    return {"model": rest.pop("model", {"uri": "/models/llama"}), "adapters": adapters,
            "resources": {"gpus": 0}, **rest}


def _pod(spec: dict) -> dict:
    return pod_template(spec, "chat")


def _engine_config(spec: dict):
    return served_config(spec, "chat")


# --- rendering --------------------------------------------------------------------------------

def test_three_adapters_become_the_engines_lora_flags():
    spec = _spec(THREE)
    assert admission_errors(_obj(spec)) == []
    config = _engine_config(spec)
    assert config.enable_lora and config.max_loras == 3 and config.max_lora_rank == 16
    # Each where the engine finds it, as the model would be: hf:// resolved offline in the
    # cache, s3:// the directory the download filled, pvc:// under its claim's mount.
    assert config.lora_adapters() == [
        LoRAModule("sql", "hf://acme/llama-sql-lora@v2"),
        LoRAModule("support", "/model-cache/s3/adapters/llama/support"),
        LoRAModule("legal", "/mnt/adapters/adapters/legal")]
    assert config.download_dir == "/model-cache"
    env = _pod(spec)["containers"][0]["env"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in env


def test_the_lora_limits_reach_the_engine():
    spec = _spec(THREE, engine={"maxLoras": 2, "maxLoraRank": 64, "maxCpuLoras": 3})
    assert admission_errors(_obj(spec)) == []
    config = _engine_config(spec)
    assert (config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (2, 64, 3)


def test_no_adapters_no_lora_flags():
    command = _pod({"model": {"uri": "/models/llama"}})["containers"][0]["command"]
    assert not any("lora" in arg for arg in command)


def test_one_init_container_downloads_the_model_then_each_remote_adapter():
    spec = _spec(THREE, model={"uri": "s3://models/llama-8b",
                               "credentialsSecretRef": {"name": "store-creds"}})
    pod = _pod(spec)
    (init,) = pod["initContainers"]
    assert init["name"] == "model-download"
    assert init["command"] == ["tokenmill", "download", "s3://models/llama-8b", HF["uri"],
                               S3["uri"], "--download-dir", "/model-cache"]
    assert init["envFrom"] == [{"secretRef": {"name": "store-creds"}}]


def test_remote_adapters_of_a_local_model_use_the_cache_and_credentials():
    """model.cache and model.credentialsSecretRef serve every download, so they are admitted
    with a model on a claim when an adapter comes from a store."""
    spec = _spec([S3], model={"uri": "pvc://models/llama-8b", "cache": {"pvc": "lora-cache"},
                              "credentialsSecretRef": {"name": "s3-creds"}})
    assert admission_errors(_obj(spec)) == []
    pod = _pod(spec)
    (init,) = pod["initContainers"]
    assert init["command"][2:-2] == [S3["uri"]]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "lora-cache"}} in (
        pod["volumes"])
    assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in (
        pod["containers"][0]["volumeMounts"])
    assert "--download-dir" not in pod["containers"][0]["command"]  # no hf:// to resolve


def test_each_adapter_claim_is_mounted_once_read_only():
    adapters = [{"name": "a", "uri": "pvc://adapters/a"}, {"name": "b", "uri": "pvc://adapters/b"},
                {"name": "c", "uri": "pvc://models/lora/c"},  # the model's claim
                {"name": "d", "uri": "pvc://more.adapters/d/"}]
    spec = _spec(adapters, model={"uri": "pvc://models/llama-8b"})
    pod = _pod(spec)
    claims = [(v["name"], v["persistentVolumeClaim"]["claimName"]) for v in pod["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == [("model", "models"), ("adapters-0", "adapters"),
                      ("adapters-1", "more.adapters")]
    assert all(v["persistentVolumeClaim"]["readOnly"] for v in pod["volumes"]
               if "persistentVolumeClaim" in v)
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["adapters-0"] == {"name": "adapters-0", "mountPath": "/mnt/adapters/adapters",
                                    "readOnly": True}
    assert [m.path for m in _engine_config(spec).lora_adapters()] == [
        "/mnt/adapters/adapters/a", "/mnt/adapters/adapters/b", "/mnt/models/lora/c",
        "/mnt/adapters/more.adapters/d"]
    assert "initContainers" not in pod


def test_an_adapter_on_the_draft_models_claim_is_read_through_its_mount():
    spec = _spec([{"name": "a", "uri": "pvc://drafts/lora-a"}], engine={"speculative": {
        "method": "draft", "model": "pvc://drafts/llama-1b", "numSpeculativeTokens": 4}})
    assert [m.path for m in _engine_config(spec).lora_adapters()] == ["/mnt/draft-model/lora-a"]
    assert [v["name"] for v in _pod(spec)["volumes"]] == ["scratch", "draft-model"]


def test_a_path_in_the_image_is_passed_as_is():
    spec = _spec([{"name": "a", "uri": "/adapters/a"}])
    pod = _pod(spec)
    assert [m.path for m in _engine_config(spec).lora_adapters()] == ["/adapters/a"]
    assert [v["name"] for v in pod["volumes"]] == ["scratch"] and "initContainers" not in pod


@pytest.mark.parametrize("spec", [
    _spec(THREE),
    _spec(THREE, model={"uri": "hf://acme/llama@main", "cache": {"pvc": "cache"}},
          engine={"maxLoras": 1, "maxLoraRank": 32}),
    _spec([{"name": "a", "uri": "pvc://adapters/a"}, {"name": "b", "uri": "/adapters/b"}]),
])
def test_children_pass_kubernetes_schemas(spec):
    for child in manifests.children("chat", "team", "uid", load("chat", spec), "tokenmill:1"):
        kubernetes_validate.validate(child, "1.31", strict=True)


# --- refused at apply and by the operator, naming the entry ----------------------------------

TOO_MANY = [{"name": f"a{i}", "uri": f"/adapters/{i}"} for i in range(MAX_ADAPTERS + 1)]
BAD = [  # (adapters, engine, what admission says, what the operator says)
    ([HF, {"name": "sql lora", "uri": "/a"}], {}, "spec.adapters[1].name", None),
    ([{"name": "-sql", "uri": "/a"}], {}, "spec.adapters[0].name", None),
    ([{"name": "a" * 64, "uri": "/a"}], {}, "spec.adapters[0].name", None),
    ([HF, {"name": "sql", "uri": "/a"}], {}, "spec.adapters[1]: Duplicate value",
     "spec.adapters[1].name: 'sql' is given twice (also spec.adapters[0].name)"),
    ([HF, {"name": "x", "uri": "gs://bucket/lora"}], {}, "spec.adapters[1].uri", None),
    ([{"name": "x", "uri": "llama-lora"}], {}, "spec.adapters[0].uri", None),
    ([{"name": "x", "uri": "smollm2-135m-instruct"}], {}, "spec.adapters[0].uri", None),
    ([{"name": "x", "uri": "hf://llama-lora"}], {}, "spec.adapters[0].uri", None),
    ([{"name": "x", "uri": "/adapters/../etc"}], {}, "spec.adapters[0].uri", None),
    ([{"name": "x"}], {}, "spec.adapters[0]", None),
    (TOO_MANY, {}, "spec.adapters", None),
    ([HF], {"maxLoraRank": MAX_LORA_RANK + 1}, "spec.engine.maxLoraRank", None),
    ([HF], {"maxLoraRank": 0}, "spec.engine.maxLoraRank", None),
    ([HF], {"maxLoras": 0}, "spec.engine.maxLoras", None),
    ([HF], {"maxLoras": MAX_ADAPTERS + 1}, "spec.engine.maxLoras", None),
    (THREE, {"maxCpuLoras": 2}, "engine.maxCpuLoras must be at least engine.maxLoras",
     "spec.engine.maxCpuLoras: 2 is less than maxLoras 3"),
    ([HF], {"maxLoras": 2, "maxCpuLoras": 1}, "engine.maxCpuLoras must be at least",
     "spec.engine.maxCpuLoras: 1 is less than maxLoras 2"),
    ([], {"maxLoraRank": 32}, "engine.maxLoraRank and engine.maxCpuLoras apply only with "
     "spec.adapters", "spec.engine.maxLoras, engine.maxLoraRank"),
]


@pytest.mark.parametrize(("adapters", "engine", "admission", "operator"), BAD,
                         ids=[str(i) for i in range(len(BAD))])
def test_a_spec_that_cannot_run_is_refused_naming_the_field(adapters, engine, admission,
                                                            operator):
    spec = _spec(adapters, engine=engine)
    errors = admission_errors(_obj(spec), paths=True)
    assert any(admission in e for e in errors), errors
    with pytest.raises(SpecError) as refused:
        load("chat", spec)
    expected = operator or admission.partition(":")[0]
    assert expected in str(refused.value), refused.value


@pytest.mark.parametrize(("spec", "name"), [
    (_spec([HF, {"name": "chat", "uri": "/a"}]), "chat"),  # metadata.name serves
    (_spec([HF, {"name": "llama", "uri": "/a"}], model={"uri": "/m", "servedName": "llama"}),
     "chat"),
])
def test_an_adapter_may_not_take_the_served_models_name(spec, name):
    (error,) = admission_errors(_obj(spec, name), paths=True)
    assert "spec.adapters[].name must differ from the served model name" in error
    with pytest.raises(SpecError, match=r"^spec\.adapters\[1\]\.name: .* is the served model"):
        load(name, spec)


def test_the_model_name_is_free_once_another_is_served():
    spec = _spec([{"name": "chat", "uri": "/a"}], model={"uri": "/m", "servedName": "llama"})
    assert admission_errors(_obj(spec)) == []
    load("chat", spec)


@pytest.mark.parametrize("flag", ["--lora-modules", "--enable-lora", "--max-loras"])
def test_extra_args_may_not_set_them_again(flag):
    spec = _spec([HF], engine={"extraArgs": [flag, "1"] if flag == "--max-loras" else [flag]})
    with pytest.raises(SpecError, match=r"is set by spec\.(adapters|engine\.maxLoras)"):
        load("chat", spec)


def test_the_crd_takes_its_bounds_from_the_engine_contract():
    spec = crd_schema()["properties"]["spec"]["properties"]
    adapters, engine = spec["adapters"], spec["engine"]["properties"]
    assert adapters["items"]["properties"]["name"]["pattern"] == NAME_PATTERN.pattern
    assert (adapters["x-kubernetes-list-type"], adapters["x-kubernetes-list-map-keys"]) == (
        "map", ["name"])
    assert adapters["maxItems"] == MAX_ADAPTERS
    assert engine["maxLoraRank"]["maximum"] == MAX_LORA_RANK
    # No defaults: the engine's apply, and a default would trip "only with spec.adapters".
    assert not any("default" in engine[k] for k in ("maxLoras", "maxLoraRank", "maxCpuLoras"))


# --- status: Loaded, Failed, Pending -----------------------------------------------------------

def exposition(*adapters: str, info: bool = False) -> str:
    """An engine's /metrics with the adapter gauge (or the same series from an Info metric)."""
    registry = CollectorRegistry()
    if info:
        metric = Info(ADAPTER_INFO.removesuffix("_info"), "adapters", ["adapter"],
                      registry=registry)
        for name in adapters:
            metric.labels(name).info({})
    else:
        gauge = Gauge(ADAPTER_INFO, "adapters", ["adapter"], registry=registry)
        for name in adapters:
            gauge.labels(name).set(1)
        gauge.labels("unloaded").set(0)
    return generate_latest(registry).decode()


@pytest.mark.parametrize("info", [False, True])
def test_the_loaded_adapters_are_read_from_the_gauge(info):
    assert parse_adapters(exposition("sql", "support", info=info)) == {"sql", "support"}
    assert parse_adapters("tokenmill_num_requests_waiting 0\n") == frozenset()


def _crashing(name: str, message: str, ready: bool = False) -> dict:
    return {"metadata": {"name": name}, "status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}],
        "containerStatuses": [{
            "name": "engine", "restartCount": 2,
            "state": {"running": {}} if ready else {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                         "message": message}}}]}}


RANK = "rank 64 is above --max-lora-rank 16"
LOG = f"INFO loading adapters\ntokenmill serve: error: lora_modules: LoRA adapter 'sql': {RANK}\n"


def test_an_engine_that_stopped_on_an_adapter_names_it():
    assert adapter_failures([_crashing("chat-b", LOG)]) == {"sql": RANK}
    terminated = _crashing("chat-a", LOG)
    container = terminated["status"]["containerStatuses"][0]
    container["state"] = {"terminated": container.pop("lastState")["terminated"]}
    assert adapter_failures([terminated]) == {"sql": RANK}


@pytest.mark.parametrize("pod", [
    _crashing("chat-a", LOG, ready=True),  # restarted since: history
    _crashing("chat-a", "model '/models/x' not found"),
    _crashing("chat-a", f"{LOG}INFO shutting down"),  # not the last line
])
def test_other_exits_name_no_adapter(pod):
    assert adapter_failures([pod]) == {}


def test_states_failed_first_then_loaded_then_pending():
    entries = status.adapters(["sql", "support", "legal"],
                              {"a": frozenset({"sql", "support"}), "b": frozenset({"sql"})}, 3,
                              {"support": RANK})
    assert entries == [
        {"name": "sql", "state": "Loaded", "message": "loaded on 2/3 ready pods"},
        {"name": "support", "state": "Failed", "message": RANK},
        {"name": "legal", "state": "Pending", "message": "no ready pod reports it loaded yet"}]
    assert status.adapters(["sql"], {}, 0, {}) == [
        {"name": "sql", "state": "Pending", "message": "waiting for a ready engine pod"}]


def _status(previous: dict, adapters: list | None) -> dict:
    return status.status("chat", "ns", 1, None, None, previous, "now", None, None, adapters)


def test_status_adapters_replaced_kept_or_removed():
    entries = status.adapters(["sql"], {}, 0, {})
    assert _status({}, entries)["adapters"] == entries
    assert "adapters" not in _status({"adapters": entries}, None)  # not computed: as it is
    assert _status({"adapters": entries}, [])["adapters"] is None  # merge patch: removed
    assert "adapters" not in _status({}, [])


def test_a_failed_adapter_is_one_warning():
    failed = {"adapters": status.adapters(["sql"], {}, 1, {"sql": RANK})}
    pending = {"adapters": status.adapters(["sql"], {}, 1, {})}
    assert ("Warning", "AdapterFailed", f"adapter sql: {RANK}") in status.events(pending, failed)
    assert not [e for e in status.events(failed, failed) if e[1] == "AdapterFailed"]
    other = {"adapters": status.adapters(["sql"], {}, 1, {"sql": "no adapter_config.json"})}
    assert [e[1] for e in status.events(failed, other)] == ["AdapterFailed"]


@pytest.mark.asyncio
async def test_loaded_adapters_over_http():
    async def metrics(request):
        return web.Response(text=exposition("sql"), content_type="text/plain")

    runner, port = await http_server("/metrics", metrics)
    try:
        def pod(name: str, port: int, ready: bool = True) -> dict:
            return {"metadata": {"name": name},
                    "spec": {"containers": [{"name": "engine", "ports": [
                        {"name": "http", "containerPort": port}]}]},
                    "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [
                        {"type": "Ready", "status": "True" if ready else "False"}]}}

        pods = [pod("up", port), pod("gone", free_port()), pod("starting", port, ready=False)]
        assert await loaded_adapters(pods) == ({"up": frozenset({"sql"})}, 2)
        assert await loaded_adapters([]) == ({}, 0)
    finally:
        await runner.cleanup()


# --- the operator running against the emulator -------------------------------------------------

NS = "default"
ISVCS = IS_PATH.format(ns=NS)
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/chat"


def _adapters(isvc: dict | None) -> dict[str, tuple[str, str]]:
    return {a["name"]: (a["state"], a["message"])
            for a in ((isvc or {}).get("status") or {}).get("adapters") or []}


async def _when(k, predicate):
    obj = await k.get(f"{ISVCS}/chat")
    return obj if predicate(obj) else None


def _engine_pod(name: str, port: int, status_: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {
                "tokenmill.io/inferenceservice": "chat",
                "app.kubernetes.io/managed-by": "tokenmill-operator"}},
            "spec": {"containers": [{"name": "engine", "ports": [
                {"name": "http", "containerPort": port}]}]},
            "status": status_}


async def _reconciles(k) -> float:
    async with aiohttp.ClientSession() as http, http.get(k.metrics) as response:
        text = await response.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tokenmill_operator_reconciles_total{"))


@pytest.mark.asyncio
async def test_status_per_adapter_from_the_pods_and_their_metrics(tmp_path):
    async def metrics(request):
        return web.Response(text=exposition("sql", "support"), content_type="text/plain")

    runner, port = await http_server("/metrics", metrics)
    try:
        async with running_operator(tmp_path) as k:
            await k.request("POST", ISVCS, inference_service("chat", _spec(THREE)))
            await k.eventually(lambda: k.get(DEPLOY))
            await k.eventually(lambda: _when(k, lambda o: set(_adapters(o).values()) == {
                ("Pending", "waiting for a ready engine pod")}))

            # The kubelet's part: a ready engine holding two adapters.
            await k.request("POST", f"/api/v1/namespaces/{NS}/pods", _engine_pod(
                "chat-a", port, {"phase": "Running", "podIP": "127.0.0.1",
                                 "conditions": [{"type": "Ready", "status": "True"}]}))
            isvc = await k.eventually(lambda: _when(
                k, lambda o: _adapters(o).get("sql", ("",))[0] == "Loaded"))
            assert _adapters(isvc) == {
                "sql": ("Loaded", "loaded on 1/1 ready pods"),
                "support": ("Loaded", "loaded on 1/1 ready pods"),
                "legal": ("Pending", "no ready pod reports it loaded yet")}

            # ...and one whose engine stopped on the third.
            await k.request("POST", f"/api/v1/namespaces/{NS}/pods", _engine_pod(
                "chat-b", port, _crashing("chat-b", LOG.replace("'sql'", "'legal'"))["status"]))
            isvc = await k.eventually(lambda: _when(
                k, lambda o: _adapters(o).get("legal", ("",))[0] == "Failed"))
            assert _adapters(isvc)["legal"] == ("Failed", RANK)
            ready = next(c for c in isvc["status"]["conditions"] if c["type"] == "Ready")
            degraded = next(c for c in isvc["status"]["conditions"] if c["type"] == "Degraded")
            assert (ready["status"], ready["reason"]) == ("False", "CrashLoopBackOff")
            assert degraded["status"] == "True" and RANK in ready["message"]

            async def failed_events():
                return [e for e in await k.events() if e["reason"] == "AdapterFailed"]

            (event,) = await k.eventually(failed_events)
            assert event["type"] == "Warning" and event["message"] == f"adapter legal: {RANK}"

            # Passes that find nothing new write no status and post nothing again (counted
            # once the passes the pods' changes started have written theirs).
            writes = await _settled_status_writes(k)
            before = await _reconciles(k)
            await k.request("PATCH", f"/api/v1/namespaces/{NS}/pods/chat-a",
                            {"metadata": {"annotations": {"touched": "1"}}})
            await k.eventually(lambda: _more(k, before))
            await asyncio.sleep(0.5)
            assert k.calls.count(("tokenmill.io", "inferenceservices/status", "patch")) == writes
            assert len(await failed_events()) == 1
        assert not set(k.calls) - granted(render_chart())
    finally:
        await runner.cleanup()


async def _more(k, before: float) -> bool:
    return await _reconciles(k) > before


async def _settled_status_writes(k, quiet: float = 1.0, limit: float = 15.0) -> int:
    """The operator's status writes so far, once none has come for `quiet` seconds."""
    count = k.calls.count(("tokenmill.io", "inferenceservices/status", "patch"))
    for _ in range(int(limit / quiet)):
        await asyncio.sleep(quiet)
        now = k.calls.count(("tokenmill.io", "inferenceservices/status", "patch"))
        if now == count:
            return now
        count = now
    raise AssertionError(f"the operator kept writing status for {limit} s")
