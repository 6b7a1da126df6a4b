"""kopf wiring: every event of an InferenceService or of a child runs the same reconcile pass.

The handlers are thin; the logic is in reconcile.py, manifests.py and status.py. Handlers are
sync functions (kopf runs them in threads) because the Kubernetes client is sync.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from . import status
from .kube import Kube, load_config
from .manifests import MANAGED_BY, OWNER_LABEL
from .reconcile import Outcome, reconcile
from .spec import GROUP, PLURAL, VERSION

DEFAULT_IMAGE = "ghcr.io/tokenmill/tokenmill:0.1.0"
RETRY_SECONDS = 30
RESYNC_SECONDS = float(os.environ.get("TOKENMILL_RESYNC_SECONDS", "300"))

_state: dict[str, Any] = {}


def engine_image() -> str:
    """The image of engine pods whose spec names none (set by the chart)."""
    return os.environ.get("TOKENMILL_ENGINE_IMAGE", DEFAULT_IMAGE)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Handler progress lives in annotations: the status belongs to the InferenceService's users.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING  # routine handler logs are not Events
    settings.networking.request_timeout = 60
    load_config()
    _state["kube"] = Kube()


def _post(body: dict, outcome: Outcome, previous: dict, report_problem: bool) -> None:
    """Events: what the pass did, why the service cannot be Ready, and Ready transitions."""
    for reason, message in outcome.actions:
        kopf.event(body, type="Normal", reason=reason, message=message)
    if report_problem and outcome.problem:
        kopf.event(body, type="Warning", reason=outcome.problem[0], message=outcome.problem[1])
    ready = status.ready_changed(previous, outcome.status)
    if ready and ready["reason"] != "InvalidSpec":
        kind = "Normal" if ready["status"] == "True" else "Warning"
        kopf.event(body, type=kind, reason=ready["reason"], message=ready["message"])


def _run(body: dict) -> Outcome:
    try:
        return reconcile(_state["kube"], body, engine_image())
    except ApiException as e:
        message = f"Kubernetes API error {e.status}: {e.reason}"
        kopf.event(body, type="Warning", reason="ReconcileFailed", message=message)
        raise kopf.TemporaryError(message, delay=RETRY_SECONDS) from None


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def reconcile_service(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """The spec changed (or the operator restarted, or the periodic resync fired)."""
    raw = dict(body)
    previous = raw.get("status") or {}
    outcome = _run(raw)
    # One Warning per problem: resume and create handlers may both see a new object.
    report = outcome.problem is not None and memo.get("problem") != outcome.problem
    memo["problem"] = outcome.problem
    _post(raw, outcome, previous, report_problem=report)
    if outcome.status != previous:
        patch.status.update(outcome.status)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY)
@kopf.on.event("v1", "services", labels=MANAGED_BY)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED_BY)
def child_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A child changed, appeared or vanished: repair it and refresh the owner's status."""
    name = body.get("metadata", {}).get("labels", {}).get(OWNER_LABEL)
    kube: Kube = _state["kube"]
    owner = name and kube.get(f"{GROUP}/{VERSION}", "InferenceService", body.metadata.namespace,
                              name)
    if not owner or owner["metadata"].get("deletionTimestamp"):
        return  # the garbage collector removes the children of a deleted service
    previous = owner.get("status") or {}
    try:
        outcome = reconcile(kube, owner, engine_image())
    except ApiException as e:
        logger.warning(f"Reconciling {name} after a child's change failed: {e.status} {e.reason}")
        return
    _post(owner, outcome, previous, report_problem=False)
    if outcome.status != previous:
        kube.patch(owner, {"status": outcome.status}, subresource="status")
