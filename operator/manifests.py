"""Pure functions from an InferenceService to the objects it owns: Deployment, Service, PDB.

Nothing here talks to a cluster, so every spec field's effect is testable as plain dicts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kubernetes.utils import parse_quantity

from .args import (
    PORT,
    adapter_claims,
    download_command,
    draft_claim,
    hub_sources,
    serve_command,
)
from .pod_layout import (
    ADAPTER_PVC_MOUNT,
    ADAPTER_VOLUME,
    CACHE_MOUNT,
    CACHE_VOLUME,
    DRAFT_PVC_MOUNT,
    DRAFT_VOLUME,
    MODEL_VOLUME,
    OWNER_LABEL,
    PVC_MOUNT,
    REPLACEABLE_MOUNTS,
    SCRATCH,
    SCRATCH_VOLUME,
    SHM,
    SHM_VOLUME,
    labels,
)
from .spec import API_KEY_ENV, GROUP, KIND, VERSION, InferenceServiceSpec, api_key_ref

GIB = 1 << 30
CONTAINER = "engine"
MODEL_DOWNLOAD = "model-download"  # the init container: hf:// and s3:// models and adapters
# The download moves bytes and checks them; the pod's effective request is the larger of this
# and the engine's, so it adds nothing to a replica that requests resources of its own.
DOWNLOAD_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}}
# The download already filled the cache: without the hub, hf:// resolves the revision from the
# cache's refs, with no network, no token and no write (the cache is mounted read-only).
OFFLINE_HUB_ENV = [{"name": "HF_HUB_OFFLINE", "value": "1"}]
STARTUP_PERIOD_SECONDS = 10
PRE_STOP_SECONDS = 5  # lets endpoints drop the pod before the server starts draining
ENGINE_UID = 1000  # the image's `tokenmill` user
# Pod Security Standards "restricted", so engines run in namespaces that enforce it. fsGroup
# lets the engine read model files on volumes that honour it (PVCs).
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_UID,
    "fsGroup": ENGINE_UID, "seccompProfile": {"type": "RuntimeDefault"},
}
# Where the platform assigns each pod's user and groups from the namespace's range (OpenShift's
# restricted-v2 SCC, which refuses a pod that names ids outside it), `tokenmill operator
# --platform-assigned-ids` leaves them out; the image's user is numeric, so runAsNonRoot holds.
PLATFORM_ASSIGNED_IDS_ENV = "TOKENMILL_PLATFORM_ASSIGNED_IDS"
ASSIGNED_IDS = ("runAsUser", "runAsGroup", "fsGroup")
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
# Caches that libraries write under $HOME by default (Triton kernels, Hugging Face, torch).
SCRATCH_ENV = [
    {"name": "HOME", "value": SCRATCH},
    {"name": "XDG_CACHE_HOME", "value": f"{SCRATCH}/.cache"},
    {"name": "TRITON_CACHE_DIR", "value": f"{SCRATCH}/.cache/triton"},
    {"name": "HF_HOME", "value": f"{SCRATCH}/.cache/huggingface"},
]
# Tensor parallelism: the ranks of one replica run in one pod and talk over NCCL, which keeps
# host-side buffers in /dev/shm (and all traffic, where GPUs lack peer access); torch shares
# tensors between processes there too. The runtime's default /dev/shm is 64 MiB, which NCCL
# outgrows; a memory-backed emptyDir of 1 GiB per rank is ample, and only the pages written
# count (against the container's memory limit).
SHM_GIB_PER_RANK = 1
# NCCL prints nothing by default; at WARN a failed collective explains itself in the log.
NCCL_ENV = [{"name": "NCCL_DEBUG", "value": "WARN"}]


def selector(name: str) -> dict[str, str]:
    """The pod selector; Deployment selectors are immutable, so it never changes."""
    return {OWNER_LABEL: name}


def url(name: str, namespace: str, domain: str) -> str:
    """The in-cluster URL of the service's OpenAI API (`domain`: the cluster's DNS domain)."""
    return f"http://{name}.{namespace}.svc.{domain}:{PORT}/v1"


def owned_metadata(owner: str, namespace: str, uid: str, name: str | None = None,
                   component: str = "inference") -> dict[str, Any]:
    """Metadata of a child of the InferenceService `owner`: its labels (which name the owner,
    so a child's event finds it) and the controller owner reference the garbage collector
    follows."""
    ref = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": owner, "uid": uid,
        "controller": True, "blockOwnerDeletion": True,
    }
    return {"name": name or owner, "namespace": namespace,
            "labels": {**labels(owner), "app.kubernetes.io/component": component},
            "ownerReferences": [ref]}


def _metadata(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return owned_metadata(name, namespace, uid)


def _probe(period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": timeout}


def _resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    res = spec.resources
    # A quantity may be written as an integer (`cpu: 2`); the Deployment gets its string form.
    memory = _with_host_tier(res.memory, spec.engine.kv_offloading_size)
    requests = {k: str(v) for k, v in (("cpu", res.cpu), ("memory", memory)) if v is not None}
    # The tier alone is no limit: the weights and the rest of the engine come on top.
    limits: dict[str, Any] = {"memory": requests["memory"]} if res.memory is not None else {}
    if spec.gpus:
        limits[res.gpu_resource_name] = str(spec.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _with_host_tier(memory: int | str | None, tier_gib: float) -> int | str | None:
    """The memory request plus the KV host tier's GiB (the engine pins that much at start-up),
    in Gi where whole, else in bytes; the tier alone where no memory is requested."""
    if not tier_gib:
        return memory
    total = int(tier_gib * GIB) + (int(parse_quantity(memory)) if memory is not None else 0)
    return f"{total // GIB}Gi" if total % GIB == 0 else str(total)


def _cache_volume(spec: InferenceServiceSpec) -> dict[str, Any]:
    """The download's cache: the spec's claim (shared by every replica and restart), else an
    emptyDir per pod."""
    claim = spec.model.cache.pvc if spec.model.cache else None
    if claim:
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    return {"name": CACHE_VOLUME, "emptyDir": {}}


def _volumes(spec: InferenceServiceSpec) -> tuple[list[dict], list[dict]]:
    """Volumes and the engine's mounts: writable scratch, shared memory for TP workers, the
    model's PVC, or the cache a remote model was downloaded into (read-only: the engine only
    reads it), a speculative draft model's PVC where it is another claim, and each claim of
    pvc:// adapters that no model is on, once however many adapters it holds; then the spec's
    own. A spec mount at /tmp or /dev/shm takes the place of the operator's (the scratch volume
    stays for the download)."""
    replaced = {m.get("mountPath") for m in spec.volume_mounts} & set(REPLACEABLE_MOUNTS)
    volumes: list[dict] = [{"name": SCRATCH_VOLUME, "emptyDir": {}}]
    mounts: list[dict] = [] if SCRATCH in replaced else [
        {"name": SCRATCH_VOLUME, "mountPath": SCRATCH}]
    tp = spec.engine.tensor_parallel_size
    if tp > 1 and SHM not in replaced:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {
            "medium": "Memory", "sizeLimit": f"{tp * SHM_GIB_PER_RANK}Gi"}})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM})
    if spec.model.uri.startswith("pvc://"):
        claim = spec.model.uri.removeprefix("pvc://").partition("/")[0]
        volumes.append({"name": MODEL_VOLUME,
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": PVC_MOUNT, "readOnly": True})
    if claim := draft_claim(spec):
        volumes.append({"name": DRAFT_VOLUME,
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": DRAFT_VOLUME, "mountPath": DRAFT_PVC_MOUNT, "readOnly": True})
    for i, claim in enumerate(adapter_claims(spec)):
        volume = f"{ADAPTER_VOLUME}-{i}"
        volumes.append({"name": volume,
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": volume, "mountPath": f"{ADAPTER_PVC_MOUNT}/{claim}",
                       "readOnly": True})
    if spec.downloads:
        volumes.append(_cache_volume(spec))
        mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT, "readOnly": True})
    return volumes + spec.volumes, mounts + spec.volume_mounts


def user_volume_offsets(spec: InferenceServiceSpec) -> tuple[int, int]:
    """Where the spec's first volume is in the pod's volumes, and its first mount in the
    engine container's (the operator's come first)."""
    volumes, mounts = _volumes(spec)
    return len(volumes) - len(spec.volumes), len(mounts) - len(spec.volume_mounts)


def _api_key_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The API key as a reference the kubelet resolves when it starts the container: the value
    never passes through the operator, the Deployment or the command line."""
    ref = api_key_ref(spec)
    if ref is None:
        return []
    return [{"name": API_KEY_ENV,
             "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def _with_spec_env(ours: list[dict[str, Any]], spec: InferenceServiceSpec,
                   fixed: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Our variables the spec does not set, then `fixed` (never overridden), then the spec's."""
    own = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.env]
    names = {e["name"] for e in own}
    return [e for e in ours if e["name"] not in names] + list(fixed) + own


def _env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The scratch locations, with tensor parallelism NCCL's settings, for a hf:// model or
    adapter the offline hub, and the API key, then the spec's variables (which may override
    all but the API key; check() refuses that one)."""
    ours = (SCRATCH_ENV + (NCCL_ENV if spec.engine.tensor_parallel_size > 1 else [])
            + (OFFLINE_HUB_ENV if hub_sources(spec) else []))
    return _with_spec_env(ours, spec, _api_key_env(spec))


def user_env_offset(spec: InferenceServiceSpec) -> int:
    """Where the spec's first variable is in the container's env (the operator's come first)."""
    return len(_env(spec)) - len(spec.env)


def _container_security_context(spec: InferenceServiceSpec) -> dict[str, Any]:
    """The restricted defaults under the spec's overrides. A privileged container, or one that
    adds CAP_SYS_ADMIN, always may escalate privileges (SecurityContext.allowPrivilegeEscalation),
    and the Deployment API refuses an explicit false beside them: the default is left out then,
    so the API server never blames a field the spec did not set. Capabilities merge a level
    deeper: `add` alone keeps the default `drop`, which restricted pod security requires."""
    own = spec.container_security_context or {}
    added = (own.get("capabilities") or {}).get("add") or []
    escalates = own.get("privileged") is True or "CAP_SYS_ADMIN" in added
    defaults = {k: v for k, v in CONTAINER_SECURITY_CONTEXT.items()
                if not (escalates and k == "allowPrivilegeEscalation")}
    merged = {**defaults, **own}
    if isinstance(own.get("capabilities"), dict):  # adding one keeps `drop: [ALL]`
        merged["capabilities"] = {**defaults["capabilities"], **own["capabilities"]}
    return merged


def startup_failures(spec: InferenceServiceSpec) -> int:
    """The startup probe's failureThreshold: spec.startupTimeoutSeconds in probe periods,
    rounded up."""
    return -(-spec.startup_timeout_seconds // STARTUP_PERIOD_SECONDS)


def _container(name: str, spec: InferenceServiceSpec, image: str,
               mounts: list[dict]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or image,
        "command": serve_command(spec, spec.model.served_name or name),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "startupProbe": _probe(STARTUP_PERIOD_SECONDS, startup_failures(spec), 5),
        "readinessProbe": _probe(5, 2, 5),
        "livenessProbe": _probe(15, 4, 10),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SECONDS)]}}},
        "volumeMounts": mounts,
        "securityContext": _container_security_context(spec),
        # A crash's last log lines become the termination message the status reports.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return {k: v for k, v in container.items() if v not in ([], {})}


def _download_container(spec: InferenceServiceSpec, image: str) -> dict[str, Any]:
    """`tokenmill download` of the remote model and adapters into the cache before the engine
    starts: the engine's image and security context, the spec's env (proxies, AWS_REGION,
    HF_ENDPOINT) and, for it alone, the credentials Secret's keys as variables, which the
    kubelet reads."""
    ref = spec.model.credentials_secret_ref
    container: dict[str, Any] = {
        "name": MODEL_DOWNLOAD,
        "image": spec.image or image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": download_command(spec),
        "env": _with_spec_env(SCRATCH_ENV, spec),
        "envFrom": [{"secretRef": {"name": ref.name}}] if ref else [],
        "resources": DOWNLOAD_RESOURCES,
        "volumeMounts": [{"name": SCRATCH_VOLUME, "mountPath": SCRATCH},
                         {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}],
        "securityContext": _container_security_context(spec),
        # A failed download's last log line (`cannot fetch MODEL: CAUSE`) reaches the status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {k: v for k, v in container.items() if v not in (None, [], {})}


def image_pull_secrets(spec: InferenceServiceSpec) -> list[dict[str, str]]:
    """The pod's imagePullSecrets: the spec's Secrets, by name."""
    return [{"name": ref.name} for ref in spec.image_pull_secrets]


def _pod_security_defaults() -> dict[str, Any]:
    """The engine pod's security context before the spec's overrides."""
    if os.environ.get(PLATFORM_ASSIGNED_IDS_ENV) != "1":
        return POD_SECURITY_CONTEXT
    return {k: v for k, v in POD_SECURITY_CONTEXT.items() if k not in ASSIGNED_IDS}


def deployment(name: str, namespace: str, uid: str, spec: InferenceServiceSpec,
               image: str) -> dict[str, Any]:
    """The Deployment running `tokenmill serve`; every spec change lands in its pod template."""
    volumes, mounts = _volumes(spec)
    pod: dict[str, Any] = {
        "serviceAccountName": spec.service_account_name,
        "imagePullSecrets": image_pull_secrets(spec),
        "priorityClassName": spec.priority_class_name,
        "runtimeClassName": spec.runtime_class_name,
        "nodeSelector": spec.node_selector,
        "tolerations": spec.tolerations,
        "affinity": spec.affinity,
        "topologySpreadConstraints": spec.topology_spread_constraints,
        "securityContext": {**_pod_security_defaults(), **(spec.pod_security_context or {})},
        # preStop, then the server's drain, then a margin for the process to exit.
        "terminationGracePeriodSeconds": PRE_STOP_SECONDS + spec.shutdown_timeout_seconds + 10,
        "initContainers": [_download_container(spec, image)] if spec.downloads else [],
        "containers": [_container(name, spec, image, mounts)],
        "volumes": volumes,
    }
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT),
                   "prometheus.io/path": "/metrics", **spec.pod_annotations}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, namespace, uid),
        "spec": {
            "replicas": spec.desired_replicas,
            "selector": {"matchLabels": selector(name)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": STARTUP_PERIOD_SECONDS * startup_failures(spec) + 600,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": {**spec.pod_labels, **labels(name)},
                             "annotations": annotations},
                "spec": {k: v for k, v in pod.items() if v not in (None, [], {})},
            },
        },
    }


def cluster_ip_service(metadata: dict[str, Any], pods: dict[str, str],
                       ports: list[dict[str, Any]]) -> dict[str, Any]:
    """A ClusterIP Service in front of the pods with the labels `pods`."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata,
            "spec": {"type": "ClusterIP", "selector": pods, "ports": ports}}


def service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    """The ClusterIP Service behind the status URL."""
    return cluster_ip_service(
        _metadata(name, namespace, uid), selector(name),
        [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}])


def pod_disruption_budget(name: str, namespace: str, uid: str) -> dict[str, Any]:
    """Lets voluntary evictions (node drains) take down one replica at a time. A replica that
    is not ready (crashing, or still loading its model) may always be evicted: under the default
    policy a budget already spent on unready pods refuses every eviction, and a drain waits
    forever for replicas that serve nothing."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(name, namespace, uid),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(name)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def children(name: str, namespace: str, uid: str, spec: InferenceServiceSpec,
             image: str) -> list[dict[str, Any]]:
    """The objects every InferenceService owns; a PDB only with more than one replica (the
    optional ones of routing and mode keda are in routing.py and keda.py)."""
    objects = [deployment(name, namespace, uid, spec, image), service(name, namespace, uid)]
    if spec.desired_replicas > 1:
        objects.append(pod_disruption_budget(name, namespace, uid))
    return objects
