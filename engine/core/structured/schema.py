"""Which JSON Schema features the grammar enforces, and the ones a request may not use.

The grammar library (xgrammar) turns a schema into a grammar; some validation keywords it
cannot express and would silently drop, so the output could break the schema it was asked to
follow. Those are refused up front, each named with where it sits in the schema. Annotations
(title, description, default, examples, ...) and unknown keywords are ignored, as JSON Schema
itself ignores them.
"""

from __future__ import annotations

import re
from typing import Any

# Validation keywords the grammar cannot express (the output could break them).
UNENFORCED = {
    "not": "negation",
    "if": "conditional subschemas",
    "then": "conditional subschemas",
    "else": "conditional subschemas",
    "dependentRequired": "dependent properties",
    "dependentSchemas": "dependent schemas",
    "dependencies": "dependent properties",
    "contains": "array contains",
    "minContains": "array contains",
    "maxContains": "array contains",
    "$dynamicRef": "dynamic references",
    "$recursiveRef": "recursive references",
}
# string formats the grammar checks; any other on a string is refused rather than ignored. A
# format on a value that can't be a string (OpenAPI's int32, int64, float, double) constrains
# nothing in JSON Schema, whose formats apply to strings only: it is ignored.
FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid",
    "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
# keywords whose value is one subschema / a map of them / a list of them
_ONE = ("additionalProperties", "items", "propertyNames", "unevaluatedProperties",
        "unevaluatedItems", "additionalItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_LOOKAROUND = re.compile(r"\(\?<?[=!]")


def unsupported_features(schema: Any) -> list[str]:
    """Every feature of `schema` the grammar can't enforce, as 'what at /json/pointer'."""
    found: list[str] = []
    _walk(schema, "", found)
    return found


def _walk(node: Any, path: str, found: list[str], needed: bool = True) -> None:
    """`needed`: every value of the whole schema holds a value here (the root, a required
    property of a needed object, the first minItems items of a needed array)."""
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        found.append(f"a schema must be an object or a boolean, got {type(node).__name__} "
                     f"at {path or '/'}")
        return
    here = path or "/"
    for keyword, what in UNENFORCED.items():
        if keyword in node:
            found.append(f"'{keyword}' ({what}) at {here}")
    # Nothing matches an empty one: where a value must be written, the grammar has no way on
    # (elsewhere the grammar leaves the place out; xgrammar refuses an empty enum anywhere).
    for keyword in ("anyOf", "oneOf", "enum"):
        if node.get(keyword) == [] and (needed or keyword == "enum"):
            found.append(f"an empty '{keyword}' (no value can match) at {here}")
    if node.get("uniqueItems") is True:
        found.append(f"'uniqueItems' at {here}")
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        found.append(f"'allOf' with more than one subschema at {here}")
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        found.append(f"'$ref' to another document ({ref}) at {here}")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in FORMATS and _may_be_string(node):
        found.append(f"'format': '{fmt}' at {here} (supported: {', '.join(sorted(FORMATS))})")
    if "multipleOf" in node and not _integer_multiple(node):
        found.append(f"'multipleOf' on a non-integer at {here} (only integer multiples of "
                     "integers are enforced)")
    pattern = node.get("pattern")
    if isinstance(pattern, str) and _LOOKAROUND.search(pattern):
        found.append(f"lookaround in 'pattern' at {here}")
    required = node.get("required") if isinstance(node.get("required"), list) else []
    least = node.get("minItems") if isinstance(node.get("minItems"), int) else 0
    for keyword in _ONE:
        if isinstance(node.get(keyword), dict | bool):
            _walk(node[keyword], f"{path}/{keyword}", found,
                  needed and keyword == "items" and least >= 1)
    for keyword in _MAP:
        if isinstance(node.get(keyword), dict):
            for name, sub in node[keyword].items():
                _walk(sub, f"{path}/{keyword}/{_escape(name)}", found,
                      needed and keyword == "properties" and name in required)
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            for i, sub in enumerate(node[keyword]):
                _walk(sub, f"{path}/{keyword}/{i}", found, needed and (
                    keyword == "allOf" or (keyword == "prefixItems" and least > i)))


def regex_unsupported(pattern: str) -> list[str]:
    """A regex constraint's features the grammar would drop."""
    return ["lookaround assertions ((?=, (?!, (?<=, (?<!)"] if _LOOKAROUND.search(pattern) else []


def _may_be_string(node: dict[str, Any]) -> bool:
    kind = node.get("type", "string")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _integer_multiple(node: dict[str, Any]) -> bool:
    value = node["multipleOf"]
    return node.get("type") == "integer" and isinstance(value, int) and not isinstance(value, bool)


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")
