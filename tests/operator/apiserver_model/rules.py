"""The rules the server refuses when a CRD is created (apiextensions-apiserver
pkg/apis/apiextensions/validation/validation.go): the checks on rule, message, reason and
fieldPath, compilation against the node's CEL type, oldSelf only where values correlate."""

from __future__ import annotations

import json
import re

from .cel_check import compile_rule
from .cel_syntax import CompileError, Unsupported
from .cel_types import decl_of
from .schema import RULES, walk


def rule_problems(schema: dict, path: str = "openAPIV3Schema") -> list[str]:
    """Rules the server refuses to compile against their node's type (an undeclared field,
    a wrong operand type, a non-bool result, oldSelf where values cannot be correlated), plus
    the text checks on rule, message, reason and fieldPath."""
    problems = []
    for node in walk(schema, path):
        rules = node.schema.get(RULES) or []
        if not rules:
            continue
        decl = decl_of(node.schema, node.root)
        for i, rule in enumerate(rules):
            where = f"{node.path}.x-kubernetes-validations[{i}]"
            problems += _rule_text_problems(rule, node.schema, where)
            if decl is None:
                problems.append(f"{where}.rule: Invalid value: the node has no CEL type (no "
                                f"type, or items/values without one), so it cannot carry rules")
                continue
            try:
                compiled = compile_rule(rule.get("rule", ""), decl)
            except CompileError as err:
                problems.append(f"{where}.rule: Invalid value: {json.dumps(rule.get('rule'))}: "
                                f"compilation failed: {err}")
                continue
            except Unsupported as err:
                problems.append(f"{where}.rule: not modelled: {err} in "
                                f"{json.dumps(rule.get('rule'))}")
                continue
            if compiled.uses_old_self and node.uncorrelated:
                problems.append(f"{where}.rule: Invalid value: {json.dumps(rule['rule'])}: "
                                f"oldSelf cannot be used on the uncorrelatable portion of the "
                                f"schema within {node.uncorrelated}")
            elif not compiled.uses_old_self and "optionalOldSelf" in rule:
                problems.append(f"{where}.optionalOldSelf: Invalid value: may not be set if "
                                f"oldSelf is not used in rule")
    return problems


def _rule_text_problems(rule: dict, s: dict, where: str) -> list[str]:
    text, message = rule.get("rule", ""), rule.get("message", "")
    if not text.strip():
        return [f"{where}.rule: Required value: rule is not specified"]
    problems = []
    if message and not message.strip():
        problems.append(f"{where}.message: Invalid value: message must be non-empty if "
                        f"specified")
    elif re.search(r"[\n\r]", message.strip()):
        problems.append(f"{where}.message: Invalid value: message must not contain line breaks")
    elif re.search(r"[\n\r]", text.strip()) and not message.strip():
        problems.append(f"{where}.message: Required value: message must be specified if rule "
                        f"contains line breaks")
    if "reason" in rule and rule["reason"] not in (
            "FieldValueRequired", "FieldValueForbidden", "FieldValueInvalid",
            "FieldValueDuplicate"):
        problems.append(f"{where}.reason: Unsupported value: {json.dumps(rule['reason'])}")
    if "fieldPath" in rule and not _valid_field_path(rule["fieldPath"], s):
        problems.append(f"{where}.fieldPath: Invalid value: fieldPath must be a valid path")
    return problems


def _valid_field_path(text: str, s: dict) -> bool:
    for dotted, quoted in re.findall(r"\.([^.\[\]]+)|\['((?:[^'\\]|\\.)*)'\]", text):
        name = dotted or quoted
        if "properties" in s and name in s["properties"]:
            s = s["properties"][name]
        elif isinstance(s.get("additionalProperties"), dict) and "properties" not in s:
            s = s["additionalProperties"]
        else:
            return False
    return re.fullmatch(r"(\.[^.\[\]]+|\['(?:[^'\\]|\\.)*'\])+", text.strip()) is not None
