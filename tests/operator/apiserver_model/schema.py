"""A CRD schema walked the way every check walks it: through properties, items and
additionalProperties, each node carrying what it inherits (apiextensions-apiserver
pkg/apis/apiextensions/validation/validation.go): defaults are forbidden in top-level metadata,
apiVersion and kind; oldSelf stops meaning anything below an atomic map or a list that is not a
map list. cel_validation.go: a rule's cardinality is the product of maxItems/maxProperties of
the lists and maps above it, None where one of them has no bound."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .saturating import mul

EMBEDDED = "x-kubernetes-embedded-resource"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
INT_OR_STRING = "x-kubernetes-int-or-string"
RULES = "x-kubernetes-validations"


@dataclass
class SchemaNode:
    """A node and what it inherits from the nodes above it."""

    schema: dict
    path: str
    cardinality: int | None = 1
    root: bool = True
    meta: str | None = None  # "top-level metadata" etc. where defaults are forbidden
    under_extra: bool = False
    uncorrelated: str | None = None  # where oldSelf stops meaning anything
    level: str = "root"


def walk(s: dict, path: str) -> Iterator[SchemaNode]:
    """Every node of `s`, depth first, the root first."""
    yield from _nodes(SchemaNode(s, path))


def _nodes(node: SchemaNode) -> Iterator[SchemaNode]:
    yield node
    s = node.schema
    for name, prop in (s.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        meta = node.meta
        if node.level == "root" and name in ("metadata", "apiVersion", "kind"):
            meta = f"in top-level {name}"
        yield from _nodes(SchemaNode(
            prop, f"{node.path}.properties[{name}]", node.cardinality,
            bool(prop.get(EMBEDDED)), meta, node.under_extra,
            node.uncorrelated or (node.path if s.get("x-kubernetes-map-type") == "atomic"
                                  else None), "field"))
    items = s.get("items")
    if isinstance(items, dict):
        keyed = s.get("x-kubernetes-list-type") == "map"
        yield from _nodes(SchemaNode(
            items, f"{node.path}.items", _times(node.cardinality, s.get("maxItems")),
            bool(items.get(EMBEDDED)), node.meta, node.under_extra,
            node.uncorrelated or (None if keyed else node.path), "item"))
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _nodes(SchemaNode(
            extra, f"{node.path}.additionalProperties",
            _times(node.cardinality, s.get("maxProperties")), bool(extra.get(EMBEDDED)),
            node.meta, True, node.uncorrelated, "field"))


def _times(cardinality: int | None, bound: int | None) -> int | None:
    if cardinality is None or bound is None:
        return None
    return mul(cardinality, max(bound, 0))
