"""What the operator records on the objects it handles, kept small whatever the spec's size.

The API server caps an object's metadata.annotations at 256 KiB in total, and client-side
`kubectl apply` already spends one copy of the whole object there. Copies of the spec in
annotations (kopf's last handled spec, the operator's last applied child) made a spec above
about 128 KiB unhandleable; digests and key skeletons do not grow with the spec.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import kopf

ANNOTATIONS_LIMIT = 256 * 1024  # the API server's TotalAnnotationSizeLimitB, keys and values
DIGEST = "sha256:"


def annotation_bytes(annotations: dict[str, str] | None) -> int:
    """Bytes of keys and values, as the API server counts them against ANNOTATIONS_LIMIT."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in (annotations or {}).items())


def skeleton(value: Any) -> Any:
    """The keys of nested objects, every other value replaced by 0: all that the removal of
    keys the operator wrote before needs (a merge patch replaces lists whole)."""
    if isinstance(value, dict):
        return {k: skeleton(v) for k, v in value.items()}
    return 0


def digest(value: Any) -> str:
    return DIGEST + hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's record of the last handled state as a digest instead of a copy.

    Our handlers are level-based and never read kopf's `old`, `new` or `diff`: kopf only needs
    to know whether the object changed since it was last handled. fetch() gives back the current
    essence when the digest matches (no change), an empty one when not (an update). A record an
    older operator stored (the essence itself, as JSON) is read as it is and replaced by a digest
    on the next change. No handler here uses field-specific extra fields, so the essence fetch()
    builds is the one kopf builds. A record that would push the annotations past the limit is
    not written (handlers report it through no_room): the object is then handled as new on
    every event, which a level-based pass tolerates."""

    def _ours(self, key: str) -> bool:
        return key.startswith(f"{self.prefix}/")

    def _digest(self, essence: Any) -> str:
        """The digest without this operator's own annotations (progress records come and go)."""
        meta = dict(essence.get("metadata") or {})
        meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                               if not self._ours(k)}
        return digest({**essence, "metadata": meta})

    def fetch(self, *, body: kopf.Body) -> Any:
        for key in self.make_keys(self.key, body=body):
            stored = body.metadata.annotations.get(key)
            if stored is not None and not stored.startswith(DIGEST):
                return json.loads(stored)
            if stored is not None:
                current = self.build(body=body)
                return current if self._digest(current) == stored else {}
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        if no_room(dict(body.metadata.annotations), self.prefix):
            return
        for key in self.make_keys(self.key, body=body):
            patch.metadata.annotations[key] = self._digest(essence)
        self._store_marker(prefix=self.prefix, patch=patch, body=body)


def _reserved(prefix: str) -> int:
    """Bytes kopf writes with a digest record: the record and kopf's marker annotation."""
    record = f"{prefix}/last-handled-configuration" + digest(None)
    return len(record) + len(f"{prefix}/kopf-managed") + len("yes")


def no_room(annotations: dict[str, str], prefix: str) -> str | None:
    """Why the operator's record of the handled spec cannot be written, or None."""
    theirs = annotation_bytes({k: v for k, v in annotations.items()
                               if not k.startswith(f"{prefix}/")})
    if theirs + _reserved(prefix) <= ANNOTATIONS_LIMIT:
        return None
    return (f"metadata.annotations: {theirs} bytes leave no room for the operator's "
            f"{_reserved(prefix)}-byte record of the handled spec (the API server allows "
            f"{ANNOTATIONS_LIMIT} bytes in total); remove annotations (client-side kubectl "
            "apply copies the whole object into kubectl.kubernetes.io/"
            "last-applied-configuration: kubectl apply --server-side does not)")
