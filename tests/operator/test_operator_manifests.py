"""Spec -> Deployment, Service, PDB: every spec field's effect, and Kubernetes' own schemas."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from operator_support import EXAMPLES

from tokenmill.engine.contract import config
from tokenmill.engine.contract.config import ConfigError, engine_args
from tokenmill.engine.contract.model_shape import ModelShape
from tokenmill.operator import manifests
from tokenmill.operator.args import serve_command
from tokenmill.operator.model_shapes import KNOWN_MODELS, allowed_sizes
from tokenmill.operator.reconcile import load
from tokenmill.operator.spec import SpecError, check, parse


def build(spec: dict, name: str = "svc") -> list[dict]:
    """The children of a parsed spec. Manifests are built for every value the API defines,
    tensor parallelism and quantization included; which of them this engine version runs is
    load()'s business (tested below)."""
    return manifests.children(name, "team", "uid-9", parse(spec), "tokenmill:1")


def pod(spec: dict) -> dict:
    return build(spec)[0]["spec"]["template"]["spec"]


def container(spec: dict) -> dict:
    return pod(spec)["containers"][0]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


FULL = {
    "model": {"uri": "pvc://weights/llama/8b", "servedName": "llama"},
    "engine": {"tensorParallelSize": 2, "quantization": "fp8", "kvCacheDtype": "fp8",
               "prefixCaching": False, "maxModelLen": 4096, "maxNumSeqs": 64,
               "maxNumBatchedTokens": 4096, "gpuMemoryUtilization": 0.85,
               "extraArgs": ["--block-size", "32"]},
    "replicas": 3,
    "resources": {"gpus": 4, "gpuResourceName": "amd.com/gpu", "cpu": "8", "memory": "64Gi"},
    "image": "registry.local/tokenmill:2", "imagePullPolicy": "Always",
    "env": [{"name": "HF_HOME", "value": "/cache"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    "nodeSelector": {"gpu": "h100"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
    "serviceAccountName": "engine",
    "podAnnotations": {"team": "ml"},
    "podSecurityContext": {"runAsUser": 2000, "supplementalGroups": [3000]},
    "containerSecurityContext": {"readOnlyRootFilesystem": False},
    "shutdownTimeoutSeconds": 120,
}


def spec_pod_security(template: dict) -> dict:
    return template["spec"]["securityContext"]


def test_every_spec_field_lands_in_the_deployment():
    deployment, service, pdb = build(FULL)
    template = deployment["spec"]["template"]
    c = template["spec"]["containers"][0]
    args = c["command"]
    assert args[:2] == ["tokenmill", "serve"]
    assert flag(args, "--host") == "0.0.0.0" and flag(args, "--port") == "8000"
    assert flag(args, "--served-model-name") == "llama"
    assert flag(args, "--shutdown-timeout") == "120"
    assert flag(args, "--model") == "/mnt/models/llama/8b"
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--quantization") == "fp8"
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert flag(args, "--max-model-len") == "4096"
    assert flag(args, "--max-num-seqs") == "64"
    assert flag(args, "--max-num-batched-tokens") == "4096"
    assert flag(args, "--gpu-memory-utilization") == "0.85"
    assert args[-2:] == ["--block-size", "32"]
    assert deployment["spec"]["replicas"] == 3
    assert c["resources"] == {"requests": {"cpu": "8", "memory": "64Gi"},
                              "limits": {"memory": "64Gi", "amd.com/gpu": "4"}}
    assert c["image"] == "registry.local/tokenmill:2" and c["imagePullPolicy"] == "Always"
    scratch = [e for e in manifests.SCRATCH_ENV if e["name"] != "HF_HOME"]  # the spec's wins
    assert c["env"] == scratch + manifests.NCCL_ENV + FULL["env"]
    assert spec_pod_security(template) == {**manifests.POD_SECURITY_CONTEXT, "runAsUser": 2000,
                                           "supplementalGroups": [3000]}
    assert c["securityContext"] == {**manifests.CONTAINER_SECURITY_CONTEXT,
                                    "readOnlyRootFilesystem": False}
    spec = template["spec"]
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"] == FULL["tolerations"]
    assert spec["affinity"] == FULL["affinity"]
    assert spec["serviceAccountName"] == "engine"
    assert spec["terminationGracePeriodSeconds"] == manifests.PRE_STOP_SECONDS + 120 + 10
    assert template["metadata"]["annotations"]["team"] == "ml"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"/tmp", "/dev/shm", "/mnt/models"}
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert pdb["kind"] == "PodDisruptionBudget"
    # A drain may evict replicas that are not ready (crashing, loading) whatever the budget.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_defaults_one_gpu_built_in_model_prefix_caching_on():
    (deployment, service) = build({})
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "tokenmill:1"
    assert flag(c["command"], "--model") == "smollm2-135m-instruct"
    assert flag(c["command"], "--served-model-name") == "svc"
    assert "--enable-prefix-caching" in c["command"]
    assert "--quantization" not in c["command"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert deployment["spec"]["template"]["spec"]["volumes"] == [
        {"name": "scratch", "emptyDir": {}}]
    assert c["volumeMounts"] == [{"name": "scratch", "mountPath": "/tmp"}]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert deployment["spec"]["replicas"] == 1


def test_cpu_replicas_get_no_gpu_and_device_cpu():
    c = container({"resources": {"gpus": 0}})
    assert flag(c["command"], "--device") == "cpu"
    assert "resources" not in c


def test_gpus_default_to_tensor_parallel_size():
    c = container({"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 4}})
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert flag(c["command"], "--model") == "/models/llama"
    assert flag(c["command"], "--tensor-parallel-size") == "4"


TP4 = {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 4}}


def test_tensor_parallel_replicas_get_shared_memory_for_nccl():
    """One pod, N ranks: /dev/shm in memory, 1 GiB per rank (the runtime's 64 MiB is too small
    for NCCL)."""
    p = pod(TP4)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in p["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in p["containers"][0]["volumeMounts"]
    assert pod({**TP4, "engine": {"tensorParallelSize": 8}})["volumes"][-1]["emptyDir"][
        "sizeLimit"] == "8Gi"


def test_tensor_parallel_replicas_get_nccl_env_the_spec_can_override():
    env = {e["name"]: e.get("value") for e in container(TP4)["env"]}
    assert env["NCCL_DEBUG"] == "WARN"
    overridden = container({**TP4, "env": [{"name": "NCCL_DEBUG", "value": "INFO"},
                                           {"name": "NCCL_P2P_DISABLE", "value": "1"}]})["env"]
    assert [e for e in overridden if e["name"].startswith("NCCL_")] == [
        {"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_P2P_DISABLE", "value": "1"}]


def test_one_rank_gets_no_shared_memory_volume_nor_nccl_env():
    c = container({"model": {"uri": "/models/llama"}})
    assert not any(e["name"].startswith("NCCL_") for e in c["env"])
    assert all(m["mountPath"] != "/dev/shm" for m in c["volumeMounts"])


def test_probes_and_drain():
    c = container({})
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # a slow model load
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert pod({})["terminationGracePeriodSeconds"] > 30  # longer than the default drain


@pytest.mark.parametrize(("timeout", "failures"), [(None, 180), (7200, 720), (65, 7)])
def test_the_startup_probe_allows_the_specs_load_time(timeout, failures):
    """A 70B model from a slow claim may take longer than the default half hour to load; the
    rollout's progress deadline follows, so a slow start is not reported as stuck."""
    spec = {} if timeout is None else {"startupTimeoutSeconds": timeout}
    startup = container(spec)["startupProbe"]
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (10, failures)
    deadline = build(spec)[0]["spec"]["progressDeadlineSeconds"]
    assert deadline > startup["periodSeconds"] * startup["failureThreshold"]


@pytest.mark.parametrize("timeout", [59, 86401, "1h"])
def test_a_startup_timeout_out_of_bounds_is_refused(timeout):
    with pytest.raises(SpecError, match="startupTimeoutSeconds"):
        load("svc", {"startupTimeoutSeconds": timeout})


def test_children_have_owner_references_labels_and_selector():
    for child in build({"replicas": 2}):
        meta = child["metadata"]
        assert meta["namespace"] == "team"
        assert meta["ownerReferences"] == [{
            "apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService", "name": "svc",
            "uid": "uid-9", "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "tokenmill-operator"
        assert meta["labels"][manifests.OWNER_LABEL] == "svc"
    deployment = build({})[0]
    assert deployment["spec"]["selector"]["matchLabels"] == {manifests.OWNER_LABEL: "svc"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[manifests.OWNER_LABEL] == "svc"


@pytest.mark.parametrize(("spec", "replicas", "pdb"), [
    ({}, 1, False),
    ({"replicas": 0}, 0, False),
    ({"replicas": 3}, 3, True),
    ({"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}}, 2, True),
    ({"replicas": 9, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}}, 5, True),
    # external: the scale subresource's writer (KEDA, HPA) owns spec.replicas; used as is.
    ({"replicas": 9, "autoscaling": {"mode": "external", "maxReplicas": 5}}, 9, True),
])
def test_replicas_and_pdb(spec, replicas, pdb):
    children = build(spec)
    assert children[0]["spec"]["replicas"] == replicas
    assert any(c["kind"] == "PodDisruptionBudget" for c in children) == pdb


AUTH = {"auth": {"apiKeySecretRef": {"name": "engine-auth"}}}


def test_api_key_comes_from_the_secret_through_the_kubelet():
    """The engine reads TOKENMILL_API_KEY, which the kubelet fills from the Secret: the
    Deployment holds only the reference, and the command line has no --api-key."""
    c = container(AUTH)
    (entry,) = [e for e in c["env"] if e["name"] == "TOKENMILL_API_KEY"]
    assert entry == {"name": "TOKENMILL_API_KEY", "valueFrom": {
        "secretKeyRef": {"name": "engine-auth", "key": "api-key"}}}
    assert "--api-key" not in c["command"]
    other = container({"auth": {"apiKeySecretRef": {"name": "s", "key": "token"}}, "env": [
        {"name": "OTHER", "value": "1"}]})
    assert [e["name"] for e in other["env"]][-2:] == ["TOKENMILL_API_KEY", "OTHER"]
    assert other["env"][-2]["valueFrom"]["secretKeyRef"] == {"name": "s", "key": "token"}


@pytest.mark.parametrize("spec", [{}, {"auth": {}}])
def test_no_api_key_without_a_secret_ref(spec):
    assert not any(e["name"] == "TOKENMILL_API_KEY" for e in container(spec)["env"])


@pytest.mark.parametrize("base", [{}, FULL, TP4], ids=["default", "full", "tp4"])
def test_auth_changes_nothing_but_the_engine_env(base):
    """Probes still GET /health and Prometheus (and the autoscaler) still scrape /metrics
    without a key: the engine leaves both open, so the pod, Service and PDB stay as they were."""
    with_auth = build({**base, **AUTH})
    without = build(base)
    for child in with_auth:
        if child["kind"] == "Deployment":
            c = child["spec"]["template"]["spec"]["containers"][0]
            c["env"] = [e for e in c["env"] if e["name"] != "TOKENMILL_API_KEY"]
    assert with_auth == without
    c = with_auth[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_the_api_key_belongs_in_a_secret_not_in_the_args():
    with pytest.raises(SpecError, match="use spec.auth.apiKeySecretRef"):
        load("svc", {"engine": {"extraArgs": ["--api-key", "sk-1"]}})
    with pytest.raises(SpecError, match="use spec.auth.apiKeySecretRef"):
        load("svc", {"engine": {"extraArgs": ["--api-key=sk-1"]}})
    with pytest.raises(SpecError, match=re.escape(
            "spec.env: TOKENMILL_API_KEY is set by spec.auth.apiKeySecretRef")):
        load("svc", {**AUTH, "env": [{"name": "TOKENMILL_API_KEY", "value": "sk-1"}]})


HF = {"model": {"uri": "hf://Qwen/Qwen3-0.6B@main"}, "resources": {"gpus": 0}}
S3 = {"model": {"uri": "s3://models/llama/8b/"}}
SHARED = {"cache": {"pvc": "model-cache"}, "credentialsSecretRef": {"name": "store-creds"}}
HF_SHARED = {**HF, "model": {**HF["model"], **SHARED}}
S3_SHARED = {**FULL, "model": {"uri": "s3://models/llama/8b", "servedName": "llama", **SHARED}}
REMOTE = [HF, S3, HF_SHARED, S3_SHARED]
REMOTE_IDS = ["hf", "s3", "hf-pvc-credentials", "s3-pvc-credentials-full"]


def init_containers(spec: dict) -> list[dict]:
    return pod(spec).get("initContainers", [])


@pytest.mark.parametrize("spec", REMOTE, ids=REMOTE_IDS)
def test_remote_models_are_downloaded_by_an_init_container(spec):
    """The same image and security context as the engine, `tokenmill download` into the cache,
    and a crash's last line in the termination message the status reports."""
    p = pod(spec)
    (init,) = p["initContainers"]
    engine = p["containers"][0]
    assert init["name"] == manifests.MODEL_DOWNLOAD
    assert init["image"] == engine["image"]
    assert init.get("imagePullPolicy") == engine.get("imagePullPolicy")
    assert init["command"] == ["tokenmill", "download", spec["model"]["uri"],
                               "--download-dir", "/model-cache"]
    assert init["securityContext"] == engine["securityContext"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert init["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"}}
    assert init["volumeMounts"] == [{"name": "scratch", "mountPath": "/tmp"},
                                    {"name": "model-cache", "mountPath": "/model-cache"}]
    assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in (
        engine["volumeMounts"])
    assert "ports" not in init and "startupProbe" not in init and "lifecycle" not in init


@pytest.mark.parametrize("spec", [HF, S3], ids=["hf", "s3"])
def test_the_download_leaves_out_what_extra_args_ignore_patterns_match(spec):
    """The engine's --ignore-patterns reach the init container, which fetches what the engine
    would; without them it fetches the whole model."""
    extra = ["--ignore-patterns", "original/*", "*.pth", "--max-logprobs", "5"]
    with_patterns = {**spec, "engine": {"extraArgs": extra}}
    (init,) = init_containers(with_patterns)
    assert init["command"] == ["tokenmill", "download", spec["model"]["uri"], "--download-dir",
                               "/model-cache", "--ignore-patterns", "original/*", "*.pth"]
    assert container(with_patterns)["command"][-5:] == extra
    (init,) = init_containers({**spec, "engine": {"extraArgs": ["--ignore-patterns=*.pth"]}})
    assert init["command"][-2:] == ["--ignore-patterns", "*.pth"]


def test_the_engine_loads_hf_models_from_the_cache_without_the_hub():
    """hf:// would ask the hub for the revision's commit on every start (a network dependency,
    credentials, and writes the read-only cache refuses); offline it reads refs/ in the cache."""
    c = container(HF)
    assert flag(c["command"], "--model") == "hf://Qwen/Qwen3-0.6B@main"
    assert flag(c["command"], "--download-dir") == "/model-cache"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    own = container({**HF, "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]})
    assert [e for e in own["env"] if e["name"] == "HF_HUB_OFFLINE"] == [
        {"name": "HF_HUB_OFFLINE", "value": "0"}]


def test_the_engine_loads_s3_models_from_the_downloaded_directory():
    """s3:// in the engine would list the prefix on every start (network and credentials) and
    take the download lock (a write): the engine gets the directory the download filled."""
    c = container(S3)
    assert flag(c["command"], "--model") == "/model-cache/s3/models/llama/8b"
    assert "--download-dir" not in c["command"]
    assert not any(e["name"] == "HF_HUB_OFFLINE" for e in c["env"])


@pytest.mark.parametrize(("spec", "volume"), [
    (HF, {"name": "model-cache", "emptyDir": {}}),
    (HF_SHARED, {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}}),
])
def test_the_cache_is_per_pod_or_a_shared_claim(spec, volume):
    assert volume in pod(spec)["volumes"]


@pytest.mark.parametrize("spec", [HF_SHARED, S3_SHARED], ids=["hf", "s3"])
def test_credentials_reach_only_the_init_container_through_the_kubelet(spec):
    p = pod(spec)
    (init,) = p["initContainers"]
    assert init["envFrom"] == [{"secretRef": {"name": "store-creds"}}]
    assert "envFrom" not in p["containers"][0]
    assert "store-creds" not in repr(p["containers"])


def test_the_spec_env_reaches_both_containers():
    """Proxies, AWS_REGION, HF_ENDPOINT: what the download needs besides the Secret."""
    env = [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]
    p = pod({**S3, "env": env})
    assert p["initContainers"][0]["env"][-1] == env[0]
    assert p["containers"][0]["env"][-1] == env[0]
    assert {"name": "HOME", "value": "/tmp"} in p["initContainers"][0]["env"]


@pytest.mark.parametrize("uri", ["smollm2-135m-instruct", "/models/llama", "pvc://weights/x"])
def test_local_models_get_no_init_container_nor_cache(uri):
    p = pod({"model": {"uri": uri}})
    assert "initContainers" not in p
    assert all(v["name"] != "model-cache" for v in p["volumes"])
    assert "--download-dir" not in p["containers"][0]["command"]


SPECS = [{}, FULL, {"resources": {"gpus": 0}}, {"replicas": 2, "engine": {"tensorParallelSize": 8},
                                                "model": {"uri": "/m"}}, TP4, {**FULL, **AUTH},
         *REMOTE]


@pytest.mark.parametrize("spec", SPECS)
def test_children_pass_kubernetes_schemas(spec):
    for child in build(spec):
        kubernetes_validate.validate(child, "1.31", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_render_valid_children(path):
    obj = yaml.safe_load(path.read_text())
    for child in build(obj["spec"], obj["metadata"]["name"]):
        kubernetes_validate.validate(child, "1.31", strict=True)


@pytest.mark.parametrize(("spec", "where"), [
    ({"engine": {"tensorParallelSize": 3}}, "spec.engine.tensorParallelSize"),
    ({"engine": {"tensorParallelSize": 2}}, "spec.engine.tensorParallelSize: 2 does not divide "
     "the attention heads of smollm2-135m-instruct (9 attention heads, 3 KV heads"),
    ({"model": {"uri": "smollm2-135m-instruct"}, "engine": {"tensorParallelSize": 8}},
     "spec.engine.tensorParallelSize: 8 does not divide"),
    ({"engine": {"quantization": "int4"}}, "spec.engine.quantization"),
    ({"engine": {"maxNumSeqs": 4096}}, "spec.engine.maxNumBatchedTokens"),
    ({"engine": {"maxModelLen": 8192, "maxNumBatchedTokens": 4096,
                 "extraArgs": ["--no-enable-chunked-prefill"]}},
     "spec.engine.maxNumBatchedTokens: (4096) must be at least max_model_len (8192) without "
     "chunked prefill"),
    ({"engine": {"extraArgs": ["--port", "9000"]}}, "--port is set by the operator"),
    ({"engine": {"extraArgs": ["--max-num-seqs=8"]}}, "set by spec.engine.maxNumSeqs"),
    ({"engine": {"extraArgs": ["--turbo"]}}, "--turbo is not a tokenmill engine flag"),
    ({"engine": {"extraArgs": ["--collect-detailed-traces", "all"]}},
     "spec.engine.extraArgs: --collect-detailed-traces: needs --otlp-traces-endpoint"),
    ({"engine": {"extraArgs": ["--tokenizer-revision", "v2"]}}, "--tokenizer-revision: the "
     "pod reads its tokenizer from the files the operator mounts or downloads"),
    ({"engine": {"extraArgs": ["--hf-token", "hf_x"]}}, "--hf-token would show the token to "
     "anyone who can read the Deployment; use spec.model.credentialsSecretRef"),
    ({"resources": {"gpus": 1}, "engine": {"tensorParallelSize": 2}, "model": {"uri": "/m"}},
     "spec.resources.gpus: 1 GPUs cannot hold tensorParallelSize 2"),
    ({"resources": {"gpus": 0}, "engine": {"tensorParallelSize": 4}, "model": {"uri": "/m"}},
     "spec.resources.gpus: 0 GPUs cannot hold tensorParallelSize 4"),
    ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "spec.autoscaling"),
    ({"autoscaling": {"minReplicas": 0}},
     "spec.autoscaling.minReplicas: 0 needs mode keda or external"),
    ({"model": {"uri": "gs://bucket/m"}}, "spec.model.uri"),
    ({"model": {"uri": "s3://bucket/m"}, "engine": {"extraArgs": ["--download-dir", "/x"]}},
     "--download-dir is set by spec.model"),
    ({"typo": 1}, "spec.typo"),
])
def test_specs_the_engine_would_reject(spec, where):
    with pytest.raises(SpecError, match=re.escape(where)):
        load("svc", spec)


def test_bad_name_is_rejected():
    with pytest.raises(SpecError, match="metadata.name"):
        load("Bad_Name", {})


def test_tp_heads_check_applies_only_where_the_model_is_known():
    check(parse({"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": 8}}))


def test_tp_splits_heads_and_mlp_and_splits_or_replicates_kv_heads():
    assert allowed_sizes(ModelShape(heads=32, kv_heads=8, intermediate_size=14336)) == [1, 2, 4, 8]
    assert allowed_sizes(ModelShape(32, 2, 14336)) == [1, 2, 4, 8]  # KV heads replicated on 4, 8
    assert allowed_sizes(ModelShape(24, 6, 14336)) == [1, 2]  # 6 KV heads: not on 4 or 8 ranks
    assert allowed_sizes(ModelShape(32, 8, 1004)) == [1, 2, 4]  # the MLP does not split 8 ways
    assert allowed_sizes(KNOWN_MODELS["smollm2-135m-instruct"]) == [1]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_tensor_parallel_size_of_the_api_runs(tp):
    spec = load("svc", {"model": {"uri": "/models/llama"}, "engine": {"tensorParallelSize": tp}})
    assert spec.gpus == tp


def test_values_the_engine_build_does_not_run_are_refused(monkeypatch):
    """The engine's table of supported values, not the API, decides what reaches a pod."""
    monkeypatch.setitem(config.SUPPORTED, "quantization", (None,))
    with pytest.raises(SpecError, match=r"spec\.engine\.quantization: int8 is not supported"):
        load("svc", {"model": {"uri": "/models/llama"}, "engine": {"quantization": "int8"}})


@pytest.mark.parametrize(("engine", "where"), [
    ({"extraArgs": ["--block-size", "7"]}, "spec.engine.extraArgs: --block-size: 7 is not one of"),
    ({"extraArgs": ["--seed", "x"]}, "spec.engine.extraArgs: argument --seed: invalid int"),
    ({"extraArgs": ["--max-num-seqs"]}, "set by spec.engine.maxNumSeqs"),
])
def test_engine_values_this_version_cannot_run_are_refused(engine, where):
    """What `tokenmill serve` would refuse at start-up never reaches a pod."""
    with pytest.raises(SpecError, match=re.escape(where)):
        load("svc", {"model": {"uri": "/models/llama"}, "engine": engine})


def test_extra_args_may_set_the_servers_own_flags():
    """vLLM's serving flags beyond the engine's (tool calling, a chat template, the waiting
    queue) reach the container; those that cannot work together are refused at apply."""
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template",
             "{{ messages[0]['content'] }}", "--max-waiting-requests", "64", "--no-vllm-metrics"]
    spec = load("svc", {"model": {"uri": "/models/llama"}, "engine": {"extraArgs": flags}})
    assert serve_command(spec, "llama")[-len(flags):] == flags


def test_extra_args_take_a_vllm_command_lines_flags():
    """What a vLLM deployment's args carry moves over unchanged (the operator's own flags
    aside)."""
    flags = ["--trust-remote-code", "--enable-chunked-prefill", "--disable-log-requests",
             "--disable-log-stats", "--enable-log-requests", "--max-log-len", "100",
             "--uvicorn-log-level", "info", "--disable-uvicorn-access-log",
             "--disable-fastapi-docs", "--allowed-origins", '["https://ui.example"]',
             "--tokenizer", "/mnt/models/tokenizer", "--pipeline-parallel-size", "1",
             "--override-generation-config", '{"temperature": 0.6}',
             "--limit-mm-per-prompt", '{"image": 4}', "--tokenizer-mode", "mistral",
             "--allowed-local-media-path", "/mnt/media", "--allowed-media-domains",
             "images.example", "cdn.example",
             "--load-format", "safetensors", "--swap-space", "4", "--disable-custom-all-reduce",
             "--scheduling-policy", "priority", "--hf-overrides",
             '{"max_position_embeddings": 65536}', "--rope-scaling",
             '{"rope_type": "yarn", "factor": 4.0}', "--rope-theta", "1000000",
             "--long-prefill-token-threshold", "512", "--dtype", "half",
             "--kv-cache-memory-bytes", "8G", "-O0", "--compilation-config",
             '{"cudagraph_capture_sizes": [1, 2, 4]}']
    spec = load("svc", {"model": {"uri": "/models/llama"}, "engine": {"extraArgs": flags}})
    assert serve_command(spec, "llama")[-len(flags):] == flags


def test_extra_args_serve_an_embedding_model():
    """vLLM's ways of serving embeddings reach the container; a pooler that cannot work is
    refused at apply."""
    for flags in (["--runner", "pooling", "--pooler-config", '{"pooling_type": "MEAN"}'],
                  ["--convert", "embed"], ["--task", "embed"]):
        spec = load("svc", {"model": {"uri": "/models/e5"}, "engine": {"extraArgs": flags}})
        assert serve_command(spec, "e5")[-len(flags):] == flags


@pytest.mark.parametrize(("flags", "where"), [
    (["--enable-auto-tool-choice"],
     "spec.engine.extraArgs: --enable-auto-tool-choice: needs --tool-call-parser"),
    (["--tool-call-parser", "jamba"], "argument --tool-call-parser: invalid choice: 'jamba'"),
    (["--max-waiting-requests", "many"], "argument --max-waiting-requests: must be a positive "
     "integer, got 'many'"),
    (["--max-waiting-requests", "0"], "argument --max-waiting-requests: must be a positive"),
    (["--served-model-name", "x"], "--served-model-name is set by the operator"),
    (["--ssl-keyfile", "/k.pem", "--ssl-certfile", "/c.pem"],
     "spec.engine.extraArgs: --ssl-keyfile: the pod's probes, its Service and the autoscaler "
     "speak plain HTTP"),
    (["--ssl-ciphers", "ECDHE+AESGCM"], "spec.engine.extraArgs: --ssl-ciphers: the pod's "
     "probes, its Service and the autoscaler speak plain HTTP"),
    (["--allowed-origins", "*"], "argument --allowed-origins: must be a JSON list of strings"),
    (["--revision", "v2"], "--revision is set by spec.model.uri (hf://ORG/NAME@REVISION)"),
    (["--pipeline-parallel-size", "2"],
     "spec.engine.extraArgs: --pipeline-parallel-size: 2 is not supported"),
    (["--uds", "/tmp/engine.sock"], "spec.engine.extraArgs: --uds: the pod's probes, its "
     "Service and the autoscaler reach the engine on port 8000"),
    (["--config", "/etc/vllm.yaml"], "spec.engine.extraArgs: --config: the pod has no such "
     "file; put its flags in extraArgs"),
    (["--tokenizer", "Org/tokenizer"], "--tokenizer Org/tokenizer: the pod has only the files "
     "the operator mounts or downloads; give an absolute path in the pod"),
    (["--pooler-config", '{"pooling_type": "MAX"}'], "spec.engine.extraArgs: --pooler-config: "
     "pooling_type 'MAX' is not one of LAST, MEAN, CLS"),
    (["--runner", "embed"], "spec.engine.extraArgs: --runner: 'embed' is not one of"),
    (["--convert", "reward"], "argument --convert: invalid choice: 'reward'"),
    (["--limit-mm-per-prompt", "image=1,video=1"], "spec.engine.extraArgs: "
     "--limit-mm-per-prompt: video: 1 is not supported"),
    (["--scheduling-policy", "lifo"], "spec.engine.extraArgs: --scheduling-policy: 'lifo' is "
     "not one of"),
    (["--hf-overrides", "max_position_embeddings=8"], "spec.engine.extraArgs: --hf-overrides: "
     "not valid JSON"),
])
def test_server_flags_that_cannot_work_are_refused(flags, where):
    with pytest.raises(SpecError, match=re.escape(where)):
        load("svc", {"model": {"uri": "/models/llama"}, "engine": {"extraArgs": flags}})


def test_flags_come_from_the_engine_option_table():
    """serve_command emits exactly what engine_args emits; the engine owns the flag names."""
    spec = parse(FULL)
    args = serve_command(spec, "llama")
    expected = engine_args(model="/mnt/models/llama/8b", tensor_parallel_size=2,
                           quantization="fp8", kv_cache_dtype="fp8", enable_prefix_caching=False,
                           max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=4096,
                           gpu_memory_utilization=0.85)
    assert args[10:10 + len(expected)] == expected
    with pytest.raises(ConfigError):
        engine_args(no_such_option=1)


def test_integer_quantities_reach_the_deployment_as_quantities():
    """`cpu: 2` is what a Pod accepts; the container gets the quantity's string form."""
    spec = {"resources": {"gpus": 0, "cpu": 2, "memory": 4294967296}}
    assert container(spec)["resources"] == {
        "requests": {"cpu": "2", "memory": "4294967296"}, "limits": {"memory": "4294967296"}}
    for child in build(spec):
        kubernetes_validate.validate(child, "1.31", strict=True)


@pytest.mark.parametrize("size, memory, resources", [
    (8, "64Gi", {"requests": {"memory": "72Gi"}, "limits": {"memory": "72Gi"}}),
    (0.5, 4000000000, {"requests": {"memory": "4536870912"},
                       "limits": {"memory": "4536870912"}}),
    (2, None, {"requests": {"memory": "2Gi"}}),
    (0, "16Gi", {"requests": {"memory": "16Gi"}, "limits": {"memory": "16Gi"}}),
])
def test_the_host_tier_is_an_engine_flag_and_adds_to_the_memory_request(size, memory,
                                                                        resources):
    spec = {"engine": {"kvOffloadingSize": size}, "resources": {"gpus": 0}}
    if memory is not None:
        spec["resources"]["memory"] = memory
    c = container(spec)
    assert flag(c["command"], "--kv-offloading-size") == (str(float(size)) if size else None)
    assert c["resources"] == resources
    for resource in resources.values():
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ResourceQuota",
                                      "metadata": {"name": "q"},
                                      "spec": {"hard": resource}}, "1.31", strict=True)


def test_a_host_tier_without_prefix_caching_is_refused():
    with pytest.raises(SpecError, match=r"spec\.engine\.kvOffloadingSize: .*needs "
                                        "enable_prefix_caching"):
        load("svc", {"engine": {"kvOffloadingSize": 1, "prefixCaching": False}})
    with pytest.raises(SpecError):
        parse({"engine": {"kvOffloadingSize": -1}})
