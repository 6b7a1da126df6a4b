"""The CEL type of a schema node and its size estimates (apiserver pkg/cel/common/schemas.go).

Strings: maxLength*4, else the longest enum value, else 3 MiB - 2; lists without maxItems:
(3 MiB - 2) / (item min size + 1); maps without maxProperties: (3 MiB - 2) / (value min size
+ 6). Map keys are the plain CEL string type whose size estimate is 0, whatever the map's
bounds. x-kubernetes-preserve-unknown-fields exposes no field to CEL: a free-form object is an
object with no fields. Property names are escaped as escaping.go does. pkg/cel/limits.go and
pkg/apis/cel/config.go: the 3 MiB request size and the JSON sizes of the string formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .schema import EMBEDDED, INT_OR_STRING

MAX_REQUEST = 3 * 1024 * 1024


@dataclass(eq=False)
class Decl:
    """A CEL type as the API server declares it: `max` is MaxElements (the size estimate of a
    value reached by path), `min_size` the smallest JSON serialization."""

    kind: str
    max: int = 0
    min_size: int = 1
    fields: dict[str, Decl] | None = None
    elem: Decl | None = None
    key: Decl | None = None


STRING_KEY = Decl("string", 0, 2)
BOOL, INT, UINT, DOUBLE = Decl("bool", 0, 4), Decl("int"), Decl("uint"), Decl("double")
STRING, BYTES, NULL = Decl("string", 0, 2), Decl("bytes", 0, 2), Decl("null", 0, 4)
DYN = Decl("dyn")
SCALARS = {"bool", "int", "uint", "double", "timestamp", "duration"}
RESERVED = {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
            "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
            "void", "while"}


def escape(name: str) -> str | None:
    """The CEL identifier of a property (escaping.go), or None when CEL cannot name it."""
    if not name or name[0].isdigit():
        return None
    if name in RESERVED:
        return f"__{name}__"
    if not re.fullmatch(r"[A-Za-z0-9_.\-/]+", name):
        return None
    out = name.replace("__", "\0").replace(".", "__dot__").replace("-", "__dash__")
    return out.replace("/", "__slash__").replace("\0", "__underscores__")


def unescape(name: str) -> str:
    """The property a CEL identifier names: escape undone."""
    if name.startswith("__") and name.endswith("__") and name[2:-2] in RESERVED:
        return name[2:-2]
    for word, char in (("dot", "."), ("dash", "-"), ("slash", "/"), ("underscores", "__")):
        name = name.replace(f"__{word}__", char)
    return name


def _with_type_and_object_meta(s: dict) -> dict:
    """At a resource root CEL always sees apiVersion, kind, metadata.name/generateName."""
    props = s.get("properties", {})
    meta = props.get("metadata", {}).get("properties", {})
    if (props.get("kind", {}).get("type") == "string"
            and props.get("apiVersion", {}).get("type") == "string"
            and meta.get("name", {}).get("type") == "string"
            and meta.get("generateName", {}).get("type") == "string"):
        return s
    text = {"type": "string"}
    props = {**props, "kind": text, "apiVersion": text, "metadata": {
        "type": "object", "properties": {"name": text, "generateName": text}}}
    return {**s, "properties": props}


def decl_of(s: dict, root: bool = False) -> Decl | None:
    """The CEL type of a schema node, or None where the server exposes none to CEL."""
    if s.get(INT_OR_STRING):
        return Decl("dyn", _bounded(s, "maxLength", 4, MAX_REQUEST - 2), 1)
    if root:
        s = _with_type_and_object_meta(s)
    kind = s.get("type")
    if kind == "array":
        items = s.get("items")
        item = decl_of(items, bool(items.get(EMBEDDED))) if isinstance(items, dict) else None
        if item is None:
            return None
        n = _bounded(s, "maxItems", 1, (MAX_REQUEST - 2) // (item.min_size + 1))
        return Decl("list", n, 2, elem=item)
    if kind == "object":
        extra = s.get("additionalProperties")
        if isinstance(extra, dict):
            value = decl_of(extra, bool(extra.get(EMBEDDED)))
            if value is None:
                return None
            n = _bounded(s, "maxProperties", 1, (MAX_REQUEST - 2) // (value.min_size + 6))
            return Decl("map", n, 2, elem=value, key=STRING_KEY)
        fields, min_size, required = {}, 2, set(s.get("required", []))
        for name, prop in s.get("properties", {}).items():
            sub = decl_of(prop, bool(prop.get(EMBEDDED)))
            if sub is None:
                continue
            if (cel_name := escape(name)) is not None:
                fields[cel_name] = sub
            if name in required and "default" not in prop:
                min_size += len(name.encode()) + sub.min_size + 4
        return Decl("object", 0, min_size, fields=fields)
    if kind == "string":
        return _string_decl(s)
    return {"boolean": BOOL, "number": DOUBLE, "integer": INT}.get(kind)


def _string_decl(s: dict) -> Decl:
    fmt = s.get("format")
    if fmt == "byte":
        return Decl("bytes", _bounded(s, "maxLength", 1, MAX_REQUEST - 2), 2)
    if fmt == "duration":
        return Decl("duration", 32, 3)
    if fmt == "date":
        return Decl("timestamp", 12, 12)
    if fmt == "date-time":
        return Decl("timestamp", 32, 21)
    if "maxLength" not in s and s.get("enum"):
        return Decl("string", max((len(v) for v in s["enum"] if isinstance(v, str)), default=0),
                    2)
    return Decl("string", _bounded(s, "maxLength", 4, MAX_REQUEST - 2), 2)


def _bounded(s: dict, key: str, scale: int, otherwise: int) -> int:
    return max(s[key], 0) * scale if key in s else otherwise
