"""Defaults as the server checks them at CRD creation (apiextensions-apiserver
pkg/apiserver/schema/defaulting/validation.go): a default, walked through properties and items
but never additionalProperties, must survive pruning, must validate against its node's OpenAPI
schema, and only then must pass the CEL rules of that node and of the nested nodes present in
it, evaluated on the default exactly as written (oldSelf = the default, no nested defaulting).
cel/validation.go: a missing field is the error "no such key: <field>"."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from .cel_check import compile_rule
from .cel_eval import Err, evaluate, to_cel
from .cel_syntax import CompileError, Unsupported
from .cel_types import decl_of
from .schema import EMBEDDED, PRESERVE, RULES, walk


def default_problems(schema: dict, path: str = "openAPIV3Schema") -> list[str]:
    """Every default the server rejects at CRD creation: unknown fields, an OpenAPI violation
    of its own node's schema, or (only when those pass) a CEL rule of its node or of a nested
    node present in it that errors or is false on the default exactly as written."""
    problems = []
    for node in walk(schema, path):
        if "default" not in node.schema or node.meta or node.under_extra:
            continue
        where, value, s = f"{node.path}.default", node.schema["default"], node.schema
        if _pruned(value, s) != value:
            problems.append(f"{where}: Invalid value: {_short(value)}: must not have unknown "
                            f"fields")
            continue
        errors = sorted(jsonschema.Draft4Validator(_openapi(s)).iter_errors(value), key=str)
        if errors:
            problems += [f"{where}{''.join(f'.{p}' for p in e.path)}: Invalid value: "
                         f"{_short(e.instance)}: {e.message}" for e in errors]
            continue
        problems += _rule_failures(s, value, where, node.root, True)
    return problems


def _pruned(value: Any, s: dict) -> Any:
    if isinstance(value, dict):
        props, extra = s.get("properties", {}), s.get("additionalProperties")
        out = {}
        for k, v in value.items():
            if k in props:
                out[k] = _pruned(v, props[k])
            elif isinstance(extra, dict):
                out[k] = _pruned(v, extra)
            elif s.get(PRESERVE) or extra is True:
                out[k] = v
        return out
    if isinstance(value, list) and isinstance(s.get("items"), dict):
        return [_pruned(v, s["items"]) for v in value]
    return value


def _openapi(s: Any) -> Any:
    """The node's schema as JSON Schema draft 4 (OpenAPI v3.0 shares its boolean
    exclusiveMinimum/Maximum); nullable admits null, formats are not checked."""
    if not isinstance(s, dict):
        return s
    out = {k: v for k, v in s.items() if k in (
        "type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
        "required", "multipleOf", "uniqueItems")}
    if s.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            out[key] = _openapi(s[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in s:
            out[key] = [_openapi(x) for x in s[key]]
    if "properties" in s:
        out["properties"] = {k: _openapi(v) for k, v in s["properties"].items()}
    return out


def _rule_failures(s: dict, value: Any, where: str, root: bool, old: bool) -> list[str]:
    """The rules of this node and of the nested nodes present in `value` that reject it, as
    the server's CEL validator walks them (transition rules only where an old value exists)."""
    decl = decl_of(s, root)
    if value is None or decl is None:
        return []
    failures = []
    cel_value = to_cel(value, s)
    for rule in s.get(RULES, []):
        try:
            compiled = compile_rule(rule.get("rule", ""), decl)
        except (CompileError, Unsupported):
            continue  # rule_problems reports it
        if compiled.uses_old_self and not old:
            continue
        result = evaluate(compiled.ast, {"self": cel_value, "oldSelf": cel_value})
        text = json.dumps(rule["rule"])
        if isinstance(result, Err):
            failures.append(f"{where}: Invalid value: {_short(value)}: {result.message} "
                            f"evaluating rule: {text}")
        elif result is not True:
            message = rule.get("message", "").strip() or f"failed rule: {rule['rule']}"
            failures.append(f"{where}: Invalid value: {_short(value)}: {message} "
                            f"(rule: {text})")
    if isinstance(value, dict):
        props, extra = s.get("properties", {}), s.get("additionalProperties")
        correlated = s.get("x-kubernetes-map-type") != "atomic"
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            if sub is not None:
                failures += _rule_failures(sub, v, f"{where}.{k}", bool(sub.get(EMBEDDED)),
                                           old and correlated)
    elif isinstance(value, list) and isinstance(s.get("items"), dict):
        keyed = s.get("x-kubernetes-list-type") == "map"
        for i, v in enumerate(value):
            failures += _rule_failures(s["items"], v, f"{where}[{i}]",
                                       bool(s["items"].get(EMBEDDED)), old and keyed)
    return failures


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
