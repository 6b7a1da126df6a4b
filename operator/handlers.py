"""kopf wiring: every event of an InferenceService or of a child runs the same reconcile pass,
and a timer runs the built-in autoscaler.

The handlers are thin; the logic is in reconcile.py, manifests.py, status.py, autoscaler.py and
scraper.py. Reconcile handlers are sync functions (kopf runs them in threads) because the
Kubernetes client is sync; the autoscaler is async so it scrapes every pod at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from . import autoscaler, bookkeeping, events, metrics, scraper, status
from .kube import MANAGER, Kube, api_message, load_config
from .manifests import selector
from .pod_layout import MANAGED_BY, OWNER_LABEL
from .reconcile import TOO_LARGE, Outcome, load, reconcile
from .spec import GROUP, PLURAL, VERSION, SpecError
from .user_paths import stable

DEFAULT_IMAGE = "ghcr.io/tokenmill/tokenmill:0.1.0"
RETRY_SECONDS = 30
MAX_RETRY_SECONDS = 600
RESYNC_SECONDS = float(os.environ.get("TOKENMILL_RESYNC_SECONDS", "300"))
AUTOSCALE_SECONDS = float(os.environ.get("TOKENMILL_AUTOSCALE_INTERVAL", "5"))
# The field manager of the built-in autoscaler's spec.replicas writes: a server-side apply of a
# manifest that sets spec.replicas then conflicts with a name that says who owns the field.
AUTOSCALER_MANAGER = "tokenmill-autoscaler"

# What the operator watches besides InferenceServices: the children it writes, the engine pods.
CHILD_RESOURCES = (("apps", "v1", "deployments"), ("v1", "services"),
                   ("policy", "v1", "poddisruptionbudgets"), ("v1", "pods"))

_state: dict[str, Any] = {}
_last_status: dict[str, dict] = {}  # uid -> the status last computed for it (see _news)
_last_status_lock = threading.Lock()
log = logging.getLogger(__name__)


def engine_image() -> str:
    """The image of engine pods whose spec names none (set by the chart)."""
    return os.environ.get("TOKENMILL_ENGINE_IMAGE", DEFAULT_IMAGE)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Handler progress lives in annotations: the status belongs to the InferenceService's users.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    # kopf's record of the handled spec: a digest, not a copy (bookkeeping.py).
    settings.persistence.diffbase_storage = bookkeeping.DigestDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING  # routine handler logs are not Events
    # Events say `From: tokenmill-operator` and name the pod that posted them.
    settings.posting.reporting_component = MANAGER
    settings.posting.reporting_instance = os.environ.get("HOSTNAME", MANAGER)
    settings.posting.event_name_prefix = f"{MANAGER}-"
    settings.networking.request_timeout = 60
    # The API server sends only our children and engine pods down the watches (kopf's label
    # filters on handlers are applied in the operator, after every pod was transferred).
    managed = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())
    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = managed
    load_config()
    _state["kube"] = Kube()
    version = _state["kube"].server_version()  # asked once; fields to refuse depend on it
    log.info(f"Kubernetes API server version: {version or 'unknown'}")


class _NamedConnection(kopf.ConnectionInfo):
    """kopf's credentials plus a User-Agent naming the operator: the API server records it as
    the field manager of kopf's own writes (status, annotations), instead of `kopf`."""

    def as_http_headers(self) -> dict[str, str]:
        return {**super().as_http_headers(), "User-Agent": Kube.user_agent()}


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own login through the kubernetes client (in-cluster, else the kubeconfig)."""
    info = kopf.login_via_client(**kwargs)
    if info is None:
        return None
    return _NamedConnection(**{f.name: getattr(info, f.name) for f in dataclasses.fields(info)})


def _news(body: dict, previous: dict, current: dict) -> list[tuple[str, str, str]]:
    """status.events against the last status this process computed for the object, not only
    the body's: passes run concurrently (spec and child events) and may all see the same stale
    status, which would post one transition several times."""
    uid = body["metadata"].get("uid", "")
    with _last_status_lock:
        before = _last_status.get(uid, previous)
        _last_status[uid] = current
    return status.events(before, current)


def _post(body: dict, outcome: Outcome, previous: dict, report_problem: bool) -> None:
    """Events: what the pass did, why the spec cannot be deployed, and status news (status.events:
    a person must act, the service became Ready, or stopped being Ready)."""
    for reason, message in outcome.actions:
        events.post(body, "Normal", reason, message)
    for reason, message in outcome.warnings:  # the API server's, on a write just made
        events.post(body, "Warning", reason, message)
    if report_problem and outcome.problem:
        events.post(body, "Warning", outcome.problem[0], outcome.problem[1])
    for kind, reason, message in _news(body, previous, outcome.status):
        events.post(body, kind, reason, message)


def _status_changed(previous: dict, current: dict) -> bool:
    """Whether the reconcile pass's own fields moved (the autoscaler writes the others)."""
    return any(previous.get(key) != value for key, value in current.items())


def _run(body: dict, memo: kopf.Memo, retry: int) -> Outcome:
    """One pass; an API error is one Event with the API server's own message (again only when
    the message changes), then retries that back off up to MAX_RETRY_SECONDS."""
    metrics.RECONCILES.labels("spec").inc()
    try:
        outcome = reconcile(_state["kube"], body, engine_image())
    except ApiException as e:
        metrics.RECONCILE_ERRORS.labels("spec").inc()
        message = stable(f"Kubernetes API error {api_message(e)}")
        if memo.get("failure") != message:
            events.post(body, "Warning", "ReconcileFailed", message)
        memo["failure"] = message
        raise kopf.TemporaryError(message, delay=_backoff(retry)) from None
    memo["failure"] = None
    if outcome.problem and outcome.problem[0] == TOO_LARGE:
        metrics.RECONCILE_ERRORS.labels("spec").inc()
    return outcome


def _backoff(retry: int) -> float:
    """Seconds before retry number `retry` of a failed pass: doubling, at most
    MAX_RETRY_SECONDS."""
    return min(RETRY_SECONDS * 2 ** retry, MAX_RETRY_SECONDS)


def _no_room(body: dict, memo: kopf.Memo) -> None:
    """A Warning (once per message) and a counted error when the object's own annotations leave
    no room for kopf's record of the handled spec (the API server would refuse the write)."""
    why = bookkeeping.no_room(body["metadata"].get("annotations") or {}, GROUP)
    if why:
        metrics.RECONCILE_ERRORS.labels("spec").inc()
        if memo.get("no_room") != why:
            events.post(body, "Warning", TOO_LARGE, why)
    memo["no_room"] = why


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def reconcile_service(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int,
                      **_: Any) -> None:
    """The spec changed (or the operator restarted, or the periodic resync fired)."""
    raw = dict(body)
    previous = raw.get("status") or {}
    outcome = _run(raw, memo, retry)
    _no_room(raw, memo)
    # One Warning per problem: resume and create handlers may both see a new object (memo),
    # and a restarted operator finds the problem already in the status.
    report = (outcome.problem is not None and memo.get("problem") != outcome.problem
              and not status.already_reported(previous, outcome.problem))
    memo["problem"] = outcome.problem
    _post(raw, outcome, previous, report_problem=report)
    if _status_changed(previous, outcome.status):
        patch.status.update(outcome.status)  # kopf writes it even when the pass retries
    if outcome.retry and outcome.problem:
        metrics.RECONCILE_ERRORS.labels("spec").inc()
        raise kopf.TemporaryError(outcome.problem[1], delay=_backoff(retry))


@kopf.on.event(*CHILD_RESOURCES[0], labels=MANAGED_BY)
@kopf.on.event(*CHILD_RESOURCES[1], labels=MANAGED_BY)
@kopf.on.event(*CHILD_RESOURCES[2], labels=MANAGED_BY)
@kopf.on.event(*CHILD_RESOURCES[3], labels=MANAGED_BY)
def child_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A child or an engine pod changed, appeared or vanished: repair the children and refresh
    the owner's status (pods say why replicas are not ready)."""
    name = body.get("metadata", {}).get("labels", {}).get(OWNER_LABEL)
    kube: Kube = _state["kube"]
    owner = name and kube.get(f"{GROUP}/{VERSION}", "InferenceService", body.metadata.namespace,
                              name)
    if not owner or owner["metadata"].get("deletionTimestamp"):
        return  # the garbage collector removes the children of a deleted service
    previous = owner.get("status") or {}
    metrics.RECONCILES.labels("child").inc()
    try:
        outcome = reconcile(kube, owner, engine_image())
    except ApiException as e:
        metrics.RECONCILE_ERRORS.labels("child").inc()
        logger.warning(f"Reconciling {name} after a child's change failed: {api_message(e)}")
        return
    if outcome.problem and outcome.problem[0] == TOO_LARGE:
        metrics.RECONCILE_ERRORS.labels("child").inc()
    # A refusal met first here (repairing a child) is said once, as the spec's pass says it;
    # the status written below keeps the next pass from saying it again.
    report = (outcome.retry and outcome.problem is not None
              and not status.already_reported(previous, outcome.problem))
    _post(owner, outcome, previous, report_problem=report)
    if _status_changed(previous, outcome.status):
        kube.patch(owner, {"status": outcome.status}, subresource="status")


def _builtin(spec: kopf.Spec, **_: Any) -> bool:
    scaling = spec.get("autoscaling")
    return isinstance(scaling, dict) and scaling.get("mode", "builtin") == "builtin"


@kopf.timer(GROUP, VERSION, PLURAL, interval=AUTOSCALE_SECONDS, when=_builtin)
async def autoscale(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """One decision of the built-in autoscaler; kopf runs timers only in the active operator
    (with peering, standby replicas are paused)."""
    meta = body["metadata"]
    try:
        await _autoscale(_state["kube"], meta["namespace"], meta["name"], logger)
    except ApiException as e:
        logger.warning(f"autoscaler: Kubernetes API error {api_message(e)}")


async def _autoscale(kube: Kube, namespace: str, name: str, logger: logging.Logger) -> None:
    """Scrape the ready pods, apply the policy, write spec.replicas (reconcile then scales the
    Deployment), status.autoscaler and Events."""
    pods = await asyncio.to_thread(kube.list, "v1", "Pod", namespace, selector(name))
    observation, failures = await scraper.observe(pods)
    metrics.SCRAPE_FAILURES.inc(len(failures))
    for pod, why in failures.items():
        logger.debug(f"autoscaler: scrape failed pod={pod} error={why!r}")

    # Read the object now: the body kopf hands a timer may predate the last decision's writes.
    obj = await asyncio.to_thread(kube.get, f"{GROUP}/{VERSION}", "InferenceService",
                                  namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return
    try:
        spec = load(name, obj.get("spec"))
    except SpecError:
        return  # the reconcile pass reports it; nothing to scale
    scaling = spec.autoscaling
    if scaling is None or scaling.mode != "builtin":
        return
    previous = (obj.get("status") or {}).get("autoscaler") or {}
    policy = autoscaler.Policy(scaling.min_replicas, scaling.max_replicas,
                               scaling.target_queue_depth, scaling.scale_down_delay_seconds)
    decision = autoscaler.decide(policy, spec.replicas, observation,
                                 autoscaler.state_from_status(previous), time.time())
    metrics.DECISIONS.labels(decision.reason).inc()
    if decision.replicas != spec.replicas:
        await asyncio.to_thread(kube.patch, obj, {"spec": {"replicas": decision.replicas}},
                                manager=AUTOSCALER_MANAGER)
    if decision.scaled:
        events.post(obj, "Normal", decision.reason, decision.message)
        log.info(f"autoscaler: {decision.reason} {namespace}/{name} "
                 f"replicas={decision.replicas} waiting={decision.waiting} "
                 f"running={decision.running}")
    elif decision.reason == autoscaler.NO_METRICS and previous.get("reason") != decision.reason:
        detail = "; ".join(f"{pod}: {why}" for pod, why in sorted(failures.items()))
        events.post(obj, "Warning", "MetricsUnavailable",
                    decision.message + (f". {detail}" if detail else ""))
    current = autoscaler.to_status(decision, observation)
    if autoscaler.status_changed(previous, current):
        await asyncio.to_thread(kube.patch, obj, {"status": {"autoscaler": current}}, "status")


def _timers_without_finalizers() -> None:
    """kopf puts a finalizer on every object a timer watches, to stop the timer before the
    object goes; with it, `kubectl delete` hangs whenever the operator is down or uninstalled.
    Our timers read the object fresh and end by themselves when it is gone (kopf stops them on
    the deletion event), so they are registered as not needing one."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False)
                          for h in spawning._handlers]


_timers_without_finalizers()
