"""Structural schemas and the keywords the server forbids (apiextensions-apiserver
pkg/apiserver/schema/validation.go: a type on every node, metadata at the root may name only
name/generateName, no additionalProperties at the root, ...; and the keyword checks of
pkg/apis/apiextensions/validation/validation.go)."""

from __future__ import annotations

import json

from .re2 import regex_problem
from .schema import EMBEDDED, INT_OR_STRING, PRESERVE, RULES, SchemaNode, walk

_TYPES = {"string", "number", "integer", "boolean", "array", "object"}
_ROOT_WITH_STATUS = {"description", "type", "format", "title", "maximum", "exclusiveMaximum",
                     "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern",
                     "maxItems", "minItems", "uniqueItems", "multipleOf", "required", "items",
                     "properties", "externalDocs", "example", PRESERVE, RULES}
_UNSUPPORTED = {"$ref": "$ref is not supported", "id": "id is not supported",
                "additionalItems": "additionalItems is not supported",
                "patternProperties": "patternProperties is not supported",
                "definitions": "definitions is not supported",
                "dependencies": "dependencies is not supported"}


def structure_problems(schema: dict, path: str = "openAPIV3Schema",
                       status_subresource: bool = False) -> list[str]:
    """What makes a schema non-structural or uses keywords the server forbids."""
    problems = []
    if status_subresource:
        extra = sorted(set(schema) - _ROOT_WITH_STATUS)
        if extra:
            problems.append(f"{path}: Invalid value: only {sorted(_ROOT_WITH_STATUS)} are "
                            f"allowed at the root of the schema if the status subresource is "
                            f"enabled, found {extra}")
    if schema.get("nullable"):
        problems.append(f"{path}.nullable: Forbidden: nullable cannot be true at the root")
    for node in walk(schema, path):
        problems += _node_problems(node)
    return problems


def _node_problems(node: SchemaNode) -> list[str]:
    s, p, problems = node.schema, node.path, []
    kind = s.get("type")
    if kind is not None and kind not in _TYPES:
        problems.append(f"{p}.type: Unsupported value: {json.dumps(kind)}: supported values: "
                        f"{sorted(_TYPES)}")
    if "default" in s and node.meta:
        problems.append(f"{p}.default: Forbidden: must not be set {node.meta}")
    problems += [f"{p}.{k}: Forbidden: {why}" for k, why in _UNSUPPORTED.items() if k in s]
    if isinstance(s.get("items"), list):
        problems.append(f"{p}.items: Forbidden: items must be a schema object and not an array")
    if s.get("uniqueItems") is True:
        problems.append(f"{p}.uniqueItems: Forbidden: uniqueItems cannot be set to true since "
                        f"the runtime complexity becomes quadratic")
    extra = s.get("additionalProperties")
    if extra is not None and s.get("properties") and extra is not True:
        problems.append(f"{p}.additionalProperties: Forbidden: additionalProperties and "
                        f"properties are mutual exclusive")
    if extra is not None and node.level == "root":
        problems.append(f"{p}.additionalProperties: Forbidden: must not be used at the root")
    if s.get(PRESERVE) is False:
        problems.append(f"{p}.{PRESERVE}: Invalid value: false: must be true or undefined")
    if s.get(INT_OR_STRING) and s.get(PRESERVE):
        problems.append(f"{p}.{PRESERVE}: Invalid value: must be false if "
                        f"x-kubernetes-int-or-string is true")
    problems += _type_problems(node)
    problems += _list_and_map_problems(s, p)
    if "pattern" in s and (why := regex_problem(s["pattern"])):
        problems.append(f"{p}.pattern: Invalid value: {json.dumps(s['pattern'])}: must be a "
                        f"valid regular expression, but isn't: {why}")
    for key in ("allOf", "anyOf", "oneOf", "not"):
        for i, sub in enumerate(s[key] if isinstance(s.get(key), list) else [s.get(key)]):
            if isinstance(sub, dict):
                where = f"{p}.{key}" + (f"[{i}]" if key != "not" else "")
                problems += _nested_value_problems(sub, where, _int_or_string_pattern(s, key, i))
    return problems


def _type_problems(node: SchemaNode) -> list[str]:
    s, p, problems = node.schema, node.path, []
    kind = s.get("type")
    if s.get(EMBEDDED):
        if kind != "object":
            problems.append(f"{p}.type: Required value: must be object if "
                            f"x-kubernetes-embedded-resource is true")
        if not s.get(PRESERVE) and not s.get("properties"):
            problems.append(f"{p}.properties: Required value: must not be empty if "
                            f"x-kubernetes-embedded-resource is true without "
                            f"x-kubernetes-preserve-unknown-fields")
    elif not kind and not s.get(INT_OR_STRING) and not s.get(PRESERVE):
        where = {"root": "at the root", "item": "for specified array items",
                 "field": "for specified object fields"}[node.level]
        problems.append(f"{p}.type: Required value: must not be empty {where}")
    if node.level == "root" and kind and kind != "object":
        problems.append(f"{p}.type: Invalid value: {json.dumps(kind)}: must be object at the "
                        f"root")
    if kind == "array" and "items" not in s:
        problems.append(f"{p}.items: Required value: must be specified")
    resource = node.level == "root" or s.get(EMBEDDED)
    props = s.get("properties") or {}
    for name in ("kind", "apiVersion"):
        if resource and name in props and props[name].get("type") != "string":
            problems.append(f"{p}.properties[{name}].type: Invalid value: must be string")
    if resource and "metadata" in props:
        problems += _metadata_problems(props["metadata"], f"{p}.properties[metadata]",
                                       node.level == "root")
    return problems


def _metadata_problems(meta: dict, p: str, root: bool) -> list[str]:
    problems = []
    if meta.get("type") != "object":
        problems.append(f"{p}.type: Invalid value: {json.dumps(meta.get('type'))}: must be "
                        f"object")
    rest = {k: v for k, v in meta.items() if k not in ("type", "default")}
    names = set(rest.pop("properties", {}) or {})
    if root and (rest or not names <= {"name", "generateName"}):
        problems.append(f"{p}: Forbidden: must not specify anything other than name and "
                        f"generateName, but metadata is implicitly specified")
    return problems


def _list_and_map_problems(s: dict, p: str) -> list[str]:
    problems, kind = [], s.get("type")
    map_type, list_type = s.get("x-kubernetes-map-type"), s.get("x-kubernetes-list-type")
    if map_type is not None and kind != "object":
        problems.append(f"{p}.type: Invalid value: must be object if x-kubernetes-map-type is "
                        f"specified")
    if map_type not in (None, "atomic", "granular"):
        problems.append(f"{p}.x-kubernetes-map-type: Unsupported value: {json.dumps(map_type)}")
    if list_type is not None and kind != "array":
        problems.append(f"{p}.type: Invalid value: must be array if x-kubernetes-list-type is "
                        f"specified")
    if list_type not in (None, "atomic", "set", "map"):
        problems.append(f"{p}.x-kubernetes-list-type: Unsupported value: "
                        f"{json.dumps(list_type)}")
    keys = s.get("x-kubernetes-list-map-keys") or []
    if keys and list_type != "map":
        problems.append(f"{p}.x-kubernetes-list-type: Invalid value: must be map if "
                        f"x-kubernetes-list-map-keys is non-empty")
    items = s.get("items") if isinstance(s.get("items"), dict) else {}
    if list_type == "map":
        if not keys:
            problems.append(f"{p}.x-kubernetes-list-map-keys: Required value: must not be "
                            f"empty if x-kubernetes-list-type is map")
        if items.get("type") != "object":
            problems.append(f"{p}.items.type: Invalid value: must be object if parent array's "
                            f"x-kubernetes-list-type is map")
        props, required = items.get("properties") or {}, set(items.get("required") or [])
        for k in keys:
            if k not in props:
                problems.append(f"{p}.x-kubernetes-list-map-keys: Invalid value: entries must "
                                f"all be names of item properties")
            elif k not in required and "default" not in props[k]:
                problems.append(f"{p}.items.properties[{k}].default: Required value: this "
                                f"property is in x-kubernetes-list-map-keys, so it must have a "
                                f"default or be a required property")
    if list_type == "set" and items.get("type") == "object" and \
            items.get("x-kubernetes-map-type") != "atomic":
        problems.append(f"{p}.items.x-kubernetes-map-type: Invalid value: must be atomic as "
                        f"item of a list with x-kubernetes-list-type=set")
    return problems


def _int_or_string_pattern(s: dict, key: str, i: int) -> bool:
    pattern = [{"type": "integer"}, {"type": "string"}]
    if key == "anyOf":
        return s.get("anyOf") == pattern
    return key == "allOf" and i == 0 and s["allOf"][0].get("anyOf") == pattern


def _nested_value_problems(s: dict, p: str, int_or_string: bool) -> list[str]:
    """Inside allOf/anyOf/oneOf/not only value validations may appear."""
    problems = []
    forbidden = ["default", "title", "description", "nullable", "externalDocs",
                 "additionalProperties", PRESERVE, EMBEDDED, INT_OR_STRING,
                 "x-kubernetes-list-map-keys", "x-kubernetes-list-type",
                 "x-kubernetes-map-type", RULES]
    if not int_or_string:
        forbidden.insert(0, "type")
    problems += [f"{p}.{k}: Forbidden: must be empty to be structural" for k in forbidden
                 if k in s]
    if "metadata" in (s.get("properties") or {}):
        problems.append(f"{p}.properties[metadata]: Forbidden: must not be specified in a "
                        f"nested context")
    for name, sub in (s.get("properties") or {}).items():
        problems += _nested_value_problems(sub, f"{p}.properties[{name}]", False)
    if isinstance(s.get("items"), dict):
        problems += _nested_value_problems(s["items"], f"{p}.items", False)
    for key in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(s.get(key) or []):
            problems += _nested_value_problems(sub, f"{p}.{key}[{i}]", False)
    return problems
