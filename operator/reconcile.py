"""One level-based pass: make an InferenceService's children match its spec, then say how it is.

Idempotent: a child is written only when it differs from the desired object, so running the
pass on every event (of the InferenceService or of any child) converges and then goes quiet.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from . import keda, manifests, routing, scraper
from . import status as status_
from .args import check_engine
from .bookkeeping import skeleton
from .kube import PLURALS, Kube, api_message
from .pods import adapter_failures, mount_failures, mounting, pod_problem
from .server_versions import check_server
from .spec import InferenceServiceSpec, SpecError, check, parse
from .user_paths import user_message, user_path

# The keys of the child as last applied (bookkeeping.skeleton): what removals() needs.
LAST_APPLIED = "tokenmill.io/last-applied"
# The paths of the last applied object the API server did not keep (JSON list of path segments).
DROPPED = "tokenmill.io/dropped-fields"
REFUSED = (400, 413, 422)  # the API server's answers to an invalid object: retrying cannot help
# Forbidden: a quota, an admission webhook or RBAC refused a write. It may clear without a new
# spec (a quota freed, a webhook's conflict removed), so the pass says so and tries again.
FORBIDDEN = 403
TOO_LARGE = "ObjectTooLarge"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class Outcome:
    """What a pass did (Events to post) and the status it computed."""

    status: dict[str, Any]
    actions: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)
    problem: tuple[str, str] | None = None  # (reason, message) of why it cannot be Ready
    warnings: list[tuple[str, str]] = field(default_factory=list)  # the API server's, as Events
    retry: bool = False  # the problem may clear by itself: run the pass again later


def load(name: str, spec: dict[str, Any] | None) -> InferenceServiceSpec:
    """The parsed spec, or SpecError for anything the cluster or the engine would reject."""
    if not DNS_LABEL.match(name):
        raise SpecError(f"metadata.name: {name!r} must be a DNS label (it names the Service)")
    parsed = parse(spec or {})
    check(parsed, name)
    check_engine(parsed)
    return parsed


def _is_quantity(path: tuple[str, ...]) -> bool:
    """Whether the field at `path` is a resource.Quantity: a request, a limit, a size limit, a
    resourceFieldRef's divisor."""
    return (path[-2:-1] in (("requests",), ("limits",))
            or path[-1:] in (("sizeLimit",), ("divisor",)))


def _same_quantity(live: Any, desired: Any) -> bool:
    """The API server stores quantities canonically ("1000m" is read back as "1")."""
    try:
        return parse_quantity(live) == parse_quantity(desired)
    except ValueError:
        return False


def covers(live: Any, desired: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether `live` has every value of `desired` (the API server may add defaults, writes
    quantities in its own form, and stores an empty optional value ("", [], {}, 0, false) as
    no key at all, Go's `omitempty`)."""
    if live is None and desired is not None and not desired:
        return True
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            covers(live.get(k), v, (*path, k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(covers(a, b, path) for a, b in zip(live, desired, strict=True)))
    return live == desired or (_is_quantity(path) and _same_quantity(live, desired))


def removals(old: Any, new: Any) -> dict[str, Any]:
    """A merge patch that deletes the keys we applied before and no longer want."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return {}
    patch: dict[str, Any] = {}
    for key, value in old.items():
        if key not in new:
            patch[key] = None
        elif sub := removals(value, new[key]):
            patch[key] = sub
    return patch


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif key not in out:
            out[key] = value
    return out


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences", [])
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


class ConflictError(Exception):
    """A child's name is taken by an object this InferenceService does not own."""


Path = list[str | int]


def absent(live: Any, desired: Any) -> list[Path]:
    """The paths of `desired` whose key `live` lacks: what the API server did not keep. An
    empty value ("", 0, false, [], {}) is not counted: Go's `omitempty` writes it as no key,
    which means the same."""
    if isinstance(desired, dict) and isinstance(live, dict):
        found: list[Path] = []
        for key, value in desired.items():
            if key not in live:
                found += [[key]] if value or value is None else []
            else:
                found += [[key, *sub] for sub in absent(live[key], value)]
        return found
    if isinstance(desired, list) and isinstance(live, list):
        pairs = enumerate(zip(live, desired, strict=False))  # a changed length is not "absent"
        return [[i, *sub] for i, (a, b) in pairs for sub in absent(a, b)]
    return []


def without(obj: Any, paths: list[Path]) -> Any:
    """A copy of `obj` lacking `paths`."""
    obj = json.loads(json.dumps(obj))
    for path in paths:
        parent = obj
        for part in path[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return obj


def path_text(path: Path) -> str:
    """A path as the API server prints it: `spec.template.spec.containers[0].image`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def dropped(live: dict[str, Any]) -> list[Path]:
    """The paths the API server did not keep of the object last applied to this child."""
    return json.loads((live.get("metadata", {}).get("annotations") or {}).get(DROPPED, "[]"))


def _written(kube: Kube, live: dict[str, Any], desired: dict[str, Any]) -> tuple[dict, list]:
    """After a write: the server's warnings, and what it did not keep recorded on the child, so
    later passes neither patch for it again nor forget it until the spec changes."""
    warned = kube.warnings()
    if missing := absent(live, desired):
        note = {"metadata": {"annotations": {DROPPED: json.dumps(missing)}}}
        live = kube.patch(live, note)
    return live, warned


def apply(kube: Kube, desired: dict[str, Any], uid: str
          ) -> tuple[dict, tuple[str, str] | None, list[str]]:
    """Create or repair one child; returns the live object, the action taken, if any, and the
    API server's warnings on it."""
    meta = desired["metadata"]
    what = f"{desired['kind']} {meta['name']}"
    applied = json.dumps(skeleton(desired), sort_keys=True, separators=(",", ":"))
    desired = _merge(desired, {"metadata": {"annotations": {LAST_APPLIED: applied}}})
    live = kube.get(desired["apiVersion"], desired["kind"], meta["namespace"], meta["name"])
    if live is None:
        try:
            live, warned = _written(kube, kube.create(desired), desired)
            return live, ("Created", f"Created {what}"), warned
        except ApiException as e:
            if e.status != 409:  # created meanwhile by a concurrent pass: repair it below
                raise
            live = kube.get(desired["apiVersion"], desired["kind"], meta["namespace"],
                            meta["name"]) or {}
    if not _owned_by(live, uid):
        raise ConflictError(f"{what} exists and is not owned by this InferenceService")
    annotations = live["metadata"].get("annotations") or {}
    kept = dropped(live) if annotations.get(LAST_APPLIED) == applied else []
    if covers(live, without(desired, kept)):
        return live, None, []
    before = json.loads(annotations.get(LAST_APPLIED, "{}"))
    patch = _merge(desired, removals(before, desired))
    if DROPPED in annotations:
        patch = _merge(patch, {"metadata": {"annotations": {DROPPED: None}}})
    live, warned = _written(kube, kube.patch(live, patch), desired)
    return live, ("Updated", f"Updated {what} to match the spec"), warned


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def observe_pods(kube: Kube, namespace: str, name: str, spec: InferenceServiceSpec | None
                  ) -> tuple[tuple[str, str] | None, list[dict[str, str]]]:
    """Why the service's pods are not ready, from the Pod objects and (for pods that run but are
    not ready) the engines' own /health; and the states of the spec's adapters, from the Pod
    objects (an engine that stopped on one) and the ready engines' /metrics (those they hold)."""
    pods = kube.list("v1", "Pod", namespace, manifests.selector(name))
    problem = pod_problem(pods, asyncio.run(scraper.health_reasons(pods)),
                          _mount_failures(kube, namespace, pods))
    if spec is None or not spec.adapters:
        return problem, []
    loaded, ready = asyncio.run(scraper.loaded_adapters(pods))
    names = [a.name for a in spec.adapters]
    return problem, status_.adapters(names, loaded, ready, adapter_failures(pods))


def _mount_failures(kube: Kube, namespace: str, pods: list[dict[str, Any]]) -> dict[str, str]:
    """The kubelet's FailedMount messages about pods that wait for their volumes; read only
    while one does, and nothing where the operator may not list Events (an older chart)."""
    if not any(mounting(pod) for pod in pods):
        return {}
    try:
        return mount_failures(kube.events(namespace, "Pod", "FailedMount"))
    except ApiException as e:
        if e.status == 403:
            return {}
        raise


def _too_large(error: ApiException) -> bool:
    """A refusal for size: a request body over the server's limit (413), or a field over its
    limit, such as annotations ("Too long: must have at most 262144 bytes")."""
    message = api_message(error)
    return error.status == 413 or (error.status == 422 and "Too long" in message)


def _refusal(error: ApiException, spec: InferenceServiceSpec) -> tuple[str, str]:
    """The problem to report for a child the API server refused, in the spec's terms and
    without the Go pointers that change on every answer."""
    message = user_message(api_message(error), spec)
    if error.status == FORBIDDEN:
        return "Forbidden", f"the API server refused a child: {message}"
    if _too_large(error):
        return TOO_LARGE, f"the API server refused a child as too large: {message}"
    return "InvalidSpec", f"the API server refused a child: {message}"


def _dropped_notice(paths: list[str], spec: InferenceServiceSpec,
                    version: tuple[int, int] | None) -> tuple[str, str] | None:
    """FieldsDropped, naming the spec's fields the API server did not keep."""
    if not paths:
        return None
    server = f"v{version[0]}.{version[1]}" if version else "server"
    fields = ", ".join(user_path(p, spec) or p for p in paths)
    return ("FieldsDropped",
            f"the API {server} did not keep {fields} (its version does not know the field or "
            "turns it off): the pods run without it, and it is not written again until the spec "
            "changes")


@dataclass(frozen=True)
class Api:
    """An API an optional feature writes to, and what the cluster lacks without it."""

    api_version: str
    kind: str
    missing: str  # the condition's reason when the cluster does not serve it
    install: str  # what to install


POOL = Api(routing.POOL_API, "InferencePool", "InferencePoolAPIMissing",
           "the Gateway API inference extension's CRDs (v1.0 or later)")
ROUTE = Api(routing.ROUTE_API, "HTTPRoute", "GatewayAPIMissing", "the Gateway API's CRDs")
SCALED_OBJECT = Api(keda.API, "ScaledObject", "KEDAMissing", "KEDA (2.x)")
MISSING = tuple(api.missing for api in (POOL, ROUTE, SCALED_OBJECT))


def missing_api(api: Api) -> tuple[str, str]:
    """(reason, message) of a condition saying which API the cluster lacks."""
    return (api.missing, f"the cluster does not serve {api.api_version} "
                         f"{PLURALS[api.kind]} ({api.kind}): install {api.install}; the engines "
                         "serve through their Service meanwhile")


@dataclass(frozen=True)
class Feature:
    """An optional part of the spec with children of its own and a condition saying how they
    are: routing.inferencePool (RoutingReady) and autoscaling mode keda (AutoscalingReady)."""

    condition: str
    apis: tuple[Api, ...]  # the first is the one it cannot do without
    kinds: tuple[tuple[str, str, str], ...]  # (apiVersion, kind, name suffix) it may own
    module: Any  # routing or keda: children(name, namespace, uid, spec)

    def wanted(self, spec: InferenceServiceSpec) -> bool:
        return bool(spec.inference_pool if self.module is routing else spec.keda)

    def needed(self, spec: InferenceServiceSpec) -> tuple[Api, ...]:
        pool = spec.inference_pool
        return tuple(api for api in self.apis if api is not ROUTE or (pool and pool.gateway))


FEATURES = (Feature("RoutingReady", (POOL, ROUTE), routing.KINDS, routing),
            Feature("AutoscalingReady", (SCALED_OBJECT,), keda.KINDS, keda))


def _feature_condition(feature: Feature, name: str, lives: dict[str, dict],
                       missing: list[Api]) -> dict[str, str]:
    """The feature's condition from what the cluster lacks and what it reports of the live
    children: the picker's Deployment has an available replica; KEDA's Ready condition."""
    if missing and missing[0] is feature.apis[0]:
        return status_.condition(feature.condition, False, *missing_api(missing[0]))
    if feature.module is routing:
        picker = lives.get("Deployment", {}).get("status") or {}
        if missing:  # the pool serves; the Gateway's route cannot be written
            return status_.condition(feature.condition, False, *missing_api(missing[0]))
        if not picker.get("availableReplicas"):
            return status_.condition(feature.condition, False, "EndpointPickerNotReady",
                                     f"InferencePool {name} is written; its endpoint picker "
                                     f"{routing.picker_name(name)} has no available replica yet")
        route = " and its HTTPRoute" if "HTTPRoute" in lives else ""
        return status_.condition(feature.condition, True, "InferencePoolReady",
                                 f"InferencePool {name}{route} with endpoint picker "
                                 f"{routing.picker_name(name)}")
    ready = next((c for c in (lives.get("ScaledObject", {}).get("status") or {}).get(
        "conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        return {**status_.condition(feature.condition, False, "ScaledObjectPending",
                                    f"KEDA has not reported on ScaledObject {name} yet"),
                "status": "Unknown"}
    ok = ready.get("status") == "True"
    return status_.condition(feature.condition, ok,
                             "ScaledObjectReady" if ok else "ScaledObjectNotReady",
                             f"KEDA: {ready.get('message') or ready.get('reason') or ''}".strip())


def _optional(kube: Kube, feature: Feature, name: str, namespace: str, uid: str,
              spec: InferenceServiceSpec, had: bool
              ) -> tuple[list[tuple[str, str]], dict[str, str] | None, list[dict]]:
    """Write a feature's children where the cluster serves their APIs and delete those the spec
    no longer asks for (only when the feature was on before, `had`, or is on: a service that
    never used it costs no request). Returns the actions, the condition (None: the feature is
    off) and the live children."""
    wanted = feature.wanted(spec)
    if not wanted and not had:
        return [], None, []
    missing = [api for api in feature.needed(spec) if not kube.serves(api.api_version, api.kind)]
    desired = []
    if wanted and not (missing and missing[0] is feature.apis[0]):
        desired = [child for child in feature.module.children(name, namespace, uid, spec)
                   if not any(child["kind"] == api.kind for api in missing)]
    actions, lives, forbidden = [], [], None
    for child in desired:
        try:
            live, action, _ = apply(kube, child, uid)
        except ApiException as e:  # the engines serve on; the feature's condition says why
            if e.status != FORBIDDEN:
                raise
            forbidden = forbidden or (f"the API server refused {child['kind']} "
                                      f"{child['metadata']['name']}: "
                                      f"{user_message(api_message(e), spec)}")
            continue
        actions += [action] if action else []
        lives.append(live)
    keep = {(child["kind"], child["metadata"]["name"]) for child in desired}
    for api_version, kind, suffix in feature.kinds:
        if (kind, name + suffix) in keep or not kube.serves(api_version, kind):
            continue
        live = kube.get(api_version, kind, namespace, name + suffix)
        if live and _owned_by(live, uid):
            kube.delete(live)
            actions.append(("Deleted", f"Deleted {kind} {name + suffix}: no longer in the spec"))
    if not wanted:
        return actions, None, lives
    if forbidden:
        return actions, status_.condition(feature.condition, False, "Forbidden", forbidden), lives
    # A feature writes one object of each kind.
    by_kind = {child["kind"]: live for child, live in zip(desired, lives, strict=True)}
    return actions, _feature_condition(feature, name, by_kind, missing), lives


def reconcile(kube: Kube, body: dict[str, Any], image: str) -> Outcome:
    """Bring the children of one InferenceService in line with its spec; compute its status."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    previous = body.get("status") or {}
    version = kube.server_version()
    lost: list[str] = []  # paths of the children the API server did not keep
    warnings: list[tuple[str, str]] = []

    extra: list[dict[str, str]] | None = None  # the features' conditions; None: as they were

    def kept_deployment() -> dict | None:
        """The last Deployment this service wrote, which keeps serving while a problem lasts."""
        live = kube.get("apps/v1", "Deployment", namespace, name)
        return live if live and _owned_by(live, uid) else None

    def done(deployment: dict | None, actions: list, problem: tuple | None = None) -> Outcome:
        pods, adapters = None, None  # adapters: None leaves status.adapters as it is
        if deployment and not problem:
            pods, adapters = observe_pods(kube, namespace, name, spec)
        elif spec and not problem:  # the Deployment is being created: nothing loaded yet
            adapters = status_.adapters([a.name for a in spec.adapters], {}, 0, {})
        notice = _dropped_notice(lost, spec, version) if spec else None
        lacking = [(c["reason"], c["message"]) for c in extra or [] if c["reason"] in MISSING]
        notice = notice or (lacking[0] if lacking else None)  # a person must install it
        st = status_.status(name, namespace, meta.get("generation"), deployment, problem,
                            previous, _now(), pods, notice, adapters, extra)
        return Outcome(st, actions, problem, warnings)

    spec = None
    try:
        spec = load(name, body.get("spec"))
        check_server(spec, version)
    except SpecError as e:  # keep the last valid Deployment serving; say what to fix
        spec = None
        return done(kept_deployment(), [], ("InvalidSpec", str(e)))

    actions = []
    deployment = None
    try:
        for child in manifests.children(name, namespace, uid, spec, image):
            live, action, warned = apply(kube, child, uid)
            deployment = live if child["kind"] == "Deployment" else deployment
            actions += [action] if action else []
            lost += [path_text(p) for p in dropped(live)]
            warnings += [("APIServerWarning", f"the API server warned on writing "
                          f"{child['kind']} {name}: {user_message(w, spec)}") for w in warned]
        if spec.desired_replicas <= 1:
            pdb = kube.get("policy/v1", "PodDisruptionBudget", namespace, name)
            if pdb and _owned_by(pdb, uid):
                kube.delete(pdb)
                actions.append(("Deleted", f"Deleted PodDisruptionBudget {name}: one replica"))
        before = {c.get("type") for c in previous.get("conditions") or []}
        extra = []
        for feature in FEATURES:
            done_, condition, lives = _optional(kube, feature, name, namespace, uid, spec,
                                                feature.condition in before)
            actions += done_
            extra += [condition] if condition else []
            lost += [path_text(p) for live in lives for p in dropped(live)]
    except ConflictError as e:
        return done(deployment, actions, ("NameConflict", str(e)))
    except ApiException as e:
        if e.status not in (*REFUSED, FORBIDDEN):
            raise
        # The spec passed admission but Kubernetes refuses what it asks for (a field only the
        # Deployment API checks): the same spec will be refused again, so say why (in the
        # spec's terms, without the Go pointers that change on every answer) and wait for a
        # new spec; the last valid Deployment keeps serving. A 403 may clear by itself: the
        # pass is tried again.
        outcome = done(kept_deployment(), actions, _refusal(e, spec))
        outcome.retry = e.status == FORBIDDEN
        return outcome
    return done(deployment, actions)
