"""Why an InferenceService's pods are not ready, in one (reason, message) a person can act on.

The Deployment only counts ready replicas; the kubelet, the scheduler and the engine's /health
say why the others are not. This reads their words from the Pod objects (and the /health
reasons the scraper fetched), picks the most urgent reason across all pods, old ReplicaSets
included (they say why a rollout is stuck), and names one pod and how many share it. Pure, so
every pod state is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenmill.engine.contract.lora import STARTUP_FAILURE

from .manifests import CONTAINER, MODEL_DOWNLOAD

# Most urgent first. Everything before "Loading" needs a person (it sets Degraded).
ORDER = (
    "InvalidImageName", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError",
    "VolumeMountFailed", "ModelDownloadFailed", "ModelLoadFailed", "OOMKilled",
    "CrashLoopBackOff", "ContainerFailed", "EngineStopped", "Unschedulable",
    "Loading", "Downloading", "Starting", "NotReady", "Draining",
)

# The kubelet alternates these while it backs off one failing pull: one reason, not a flicker.
IMAGE_PULL = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "ImageInspectError",
              "RegistryUnavailable", "SignatureValidationFailed"}
MESSAGE_CHARS = 300


def _short(text: str, tail: bool = False) -> str:
    """One line of at most MESSAGE_CHARS; a log keeps its end, where the error is."""
    line = "; ".join(part.strip() for part in text.splitlines() if part.strip())
    if len(line) <= MESSAGE_CHARS:
        return line
    return "..." + line[-MESSAGE_CHARS:] if tail else line[:MESSAGE_CHARS] + "..."


def _said(reason: str, message: str) -> str:
    """`reason: message`, or the reason alone when there is no message."""
    message = _short(message)
    return f"{reason}: {message}" if message else reason


def _rank(reason: str) -> int:
    """Place in ORDER; the kubelet's other *Error reasons (RunContainerError, PostStartHookError,
    ...) are kept as it names them and rank with CreateContainerError."""
    return ORDER.index(reason if reason in ORDER else "CreateContainerError")


def needs_action(reason: str) -> bool:
    """Whether a pod_problem reason needs a person (Degraded) rather than time (Loading)."""
    return _rank(reason) < ORDER.index("Loading")


def _name(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def _gone(pod: dict[str, Any]) -> bool:
    """Being deleted or finished (e.g. Evicted): the ReplicaSet's replacement tells the story."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or (
        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))


def _exit(terminated: dict[str, Any]) -> str:
    """`Error, exit code 1: <log tail>` from a container's terminated state."""
    text = f"{terminated.get('reason') or 'exited'}, exit code {terminated.get('exitCode', '?')}"
    message = _short(terminated.get("message") or "", tail=True)
    return f"{text}: {message}" if message else text


def _container(status: dict[str, Any], init: bool) -> tuple[str, str] | None:
    """(reason, detail) of one container that is waiting on a failure or has just failed."""
    state = status.get("state") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
    reason = waiting.get("reason", "")
    if reason == "CrashLoopBackOff":
        last = (status.get("lastState") or {}).get("terminated") or {}
        restarts = status.get("restartCount", 0)
        detail = (f"CrashLoopBackOff ({restarts} restart{'' if restarts == 1 else 's'}): "
                  f"last exit {_exit(last)}")
        return ("OOMKilled" if last.get("reason") == "OOMKilled" else reason), detail
    if reason:
        detail = _said(reason, waiting.get("message") or "")
        if reason in IMAGE_PULL:
            return "ImagePullBackOff", detail
        if reason == "InvalidImageName" or reason.endswith("Error"):
            return reason, detail  # CreateContainerConfigError, CreateContainerError, ...
        return "Starting", detail  # ContainerCreating, PodInitializing
    if terminated and not (init and terminated.get("exitCode") == 0):
        return ("OOMKilled" if terminated.get("reason") == "OOMKilled" else "ContainerFailed",
                _exit(terminated))
    return None


def _last_line(text: str) -> str:
    """The last line of a log tail: what `tokenmill download` says when it fails."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _short(lines[-1], tail=True) if lines else ""


def _download(status: dict[str, Any], pod: str) -> tuple[str, str] | None:
    """(reason, detail) of the model download (the init container): running, or failed with
    the tool's one line; None otherwise, and for an OOM kill, which says more as it is."""
    state = status.get("state") or {}
    if state.get("running"):
        return "Downloading", (f"downloading the model; `kubectl logs {pod} -c {MODEL_DOWNLOAD}` "
                               "shows its progress")
    crash_looping = (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff"
    terminated = ((status.get("lastState") or {}).get("terminated") if crash_looping
                  else state.get("terminated")) or {}
    if not terminated or terminated.get("exitCode") == 0 or terminated.get(
            "reason") == "OOMKilled":
        return None
    restarts = status.get("restartCount", 0)
    tries = f" ({restarts} restart{'' if restarts == 1 else 's'})" if crash_looping else ""
    line = _last_line(terminated.get("message") or "")
    detail = f"exit code {terminated.get('exitCode', '?')}{tries}"
    return "ModelDownloadFailed", f"{detail}: {line}" if line else detail


def _health(reason: str) -> str:
    """The condition reason for the engine's /health answer (or the scraper's failure)."""
    if reason == "loading":
        return "Loading"
    if reason == "draining":
        return "Draining"
    if reason.startswith("model failed to load"):
        return "ModelLoadFailed"
    if reason == "engine loop stopped":
        return "EngineStopped"
    return "NotReady"


def _condition(pod: dict[str, Any], type_: str) -> dict[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), {})


def why_not_ready(pod: dict[str, Any], health: str | None = None,
                  mount: str | None = None) -> tuple[str, str] | None:
    """(reason, detail) of one pod's most urgent problem; None if it is ready or going away.
    `mount` is the kubelet's last FailedMount message about the pod, which counts while the
    pod has not started (after that, the volume was mounted)."""
    status = pod.get("status") or {}
    if _gone(pod) or _condition(pod, "Ready").get("status") == "True":
        return None
    found = []
    if mount and mounting(pod):
        found.append(("VolumeMountFailed", _said("FailedMount", _short(mount))))
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False":
        why = scheduled.get("reason") or "Pending"
        found.append(("Unschedulable" if why == "Unschedulable" else "Starting",
                      _said(why, scheduled.get("message") or "")))
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for container in status.get(key) or []:
            name = container.get("name", "")
            download = init and name == MODEL_DOWNLOAD
            problem = ((download and _download(container, _name(pod)))
                       or _container(container, init))
            if problem is None:
                continue
            if init:
                problem = problem[0], f"init container {name}: {problem[1]}"
            elif name != CONTAINER:
                problem = problem[0], f"container {name}: {problem[1]}"
            found.append(problem)
    if health:
        found.append((_health(health), _short(health)))
    if not found:
        found.append(("NotReady", "running, not ready") if status.get("phase") == "Running"
                     else ("Starting", (status.get("phase") or "Pending").lower()))
    return min(found, key=lambda problem: _rank(problem[0]))


def mounting(pod: dict[str, Any]) -> bool:
    """Whether the pod is on a node and its containers have not started: where the kubelet
    mounts its volumes (and says FailedMount when it cannot)."""
    status = pod.get("status") or {}
    return (not _gone(pod) and status.get("phase", "Pending") == "Pending"
            and _condition(pod, "PodScheduled").get("status") == "True")


def _when(event: dict[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return (event.get("lastTimestamp") or event.get("eventTime")
            or meta.get("creationTimestamp") or "")


def mount_failures(events: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> the message of the last FailedMount Event about it: the kubelet's only word
    on a volume it cannot mount (a ConfigMap or Secret that does not exist), while the pod
    waits in ContainerCreating."""
    found: dict[str, tuple[str, str]] = {}
    for event in events:
        involved = event.get("involvedObject") or {}
        if event.get("reason") != "FailedMount" or involved.get("kind") != "Pod":
            continue
        name, when = involved.get("name", ""), _when(event)
        if name not in found or when >= found[name][0]:
            found[name] = when, event.get("message") or ""
    return {name: message for name, (_, message) in found.items()}


def pod_problem(pods: list[dict[str, Any]], health: Mapping[str, str] | None = None,
                mounts: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(reason, message) of the most urgent reason the pods are not ready, or None if none is.

    `health` maps pod names to the engine's /health reason (see scraper.health_reasons),
    `mounts` to the kubelet's FailedMount message (mount_failures). The message names the first
    pod (by name) with that reason and how many of the live pods share it: "pod a: ..." or
    "2/3 pods, e.g. a: ...".
    """
    health, mounts = health or {}, mounts or {}
    live = [p for p in pods if not _gone(p)]
    problems = {}
    for pod in sorted(live, key=_name):
        name = _name(pod)
        if found := why_not_ready(pod, health.get(name), mounts.get(name)):
            problems[name] = found
    if not problems:
        return None
    reason = min((r for r, _ in problems.values()), key=_rank)
    sharing = [name for name, (r, _) in problems.items() if r == reason]
    detail = problems[sharing[0]][1]
    if len(sharing) == 1:
        return reason, f"pod {sharing[0]}: {detail}"
    return reason, f"{len(sharing)}/{len(live)} pods, e.g. {sharing[0]}: {detail}"


# An engine that cannot load an adapter stops at start-up with this as its last log line, which
# the kubelet keeps as the container's termination message (FallbackToLogsOnError).
ADAPTER_FAILED = STARTUP_FAILURE


def _engine_exit(pod: dict[str, Any]) -> str:
    """The engine container's last termination message, if it is not running now."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") != CONTAINER or (container.get("state") or {}).get("running"):
            continue
        state = container.get("state") or {}
        terminated = state.get("terminated") or (container.get("lastState") or {}).get(
            "terminated") or {}
        return terminated.get("message") or ""
    return ""


def adapter_failures(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Adapter name -> why an engine could not load it, from the termination messages of engine
    containers that stopped on it (the first pod by name that says so). A running or ready
    pod's earlier exit is history: it does not count."""
    failed: dict[str, str] = {}
    for pod in sorted(pods, key=_name):
        if _gone(pod) or _condition(pod, "Ready").get("status") == "True":
            continue
        lines = [line.strip() for line in _engine_exit(pod).splitlines() if line.strip()]
        found = ADAPTER_FAILED.search(lines[-1]) if lines else None
        if found and found["name"] not in failed:
            failed[found["name"]] = _short(found["reason"])
    return failed
