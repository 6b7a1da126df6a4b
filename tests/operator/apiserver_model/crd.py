"""The whole CRD: its names, versions, scale subresource and printer columns
(apiextensions-apiserver validation.go), and every version's schema through every stage."""

from __future__ import annotations

import json
import re

from .cel_cost import cost_problems
from .defaults import default_problems
from .rules import rule_problems
from .structure import structure_problems

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def crd_problems(crd: dict) -> list[str]:
    """Everything this model knows the API server would reject in `crd` (empty: accepted)."""
    problems = _crd_level_problems(crd)
    for i, version in enumerate(crd.get("spec", {}).get("versions", [])):
        base = f"spec.versions[{i}].schema.openAPIV3Schema"
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            problems.append(f"{base}: Required value: schemas are required")
            continue
        status = (version.get("subresources") or {}).get("status") is not None
        problems += structure_problems(schema, base, status)
        problems += default_problems(schema, base)
        problems += rule_problems(schema, base)
        problems += cost_problems(schema, base)
        problems += _version_problems(version, f"spec.versions[{i}]")
    return list(dict.fromkeys(problems))


def _crd_level_problems(crd: dict) -> list[str]:
    spec, problems = crd.get("spec", {}), []
    names, group = spec.get("names", {}), spec.get("group", "")
    if crd.get("metadata", {}).get("name") != f"{names.get('plural')}.{group}":
        problems.append("metadata.name: Invalid value: must be spec.names.plural+\".\"+"
                        "spec.group")
    if not _DNS1123.fullmatch(group) or "." not in group:
        problems.append(f"spec.group: Invalid value: {json.dumps(group)}: should be a domain "
                        f"with at least one dot")
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(f"spec.scope: Unsupported value: {json.dumps(spec.get('scope'))}")
    for key in ("plural", "singular", "kind", "listKind"):
        value = names.get(key, "")
        if not value:
            problems.append(f"spec.names.{key}: Required value")
        elif not _DNS1035.fullmatch(value.lower() if key in ("kind", "listKind") else value):
            problems.append(f"spec.names.{key}: Invalid value: {json.dumps(value)}")
    for key in ("shortNames", "categories"):
        problems += [f"spec.names.{key}[{j}]: Invalid value: {json.dumps(v)}"
                     for j, v in enumerate(names.get(key, [])) if not _DNS1035.fullmatch(v)]
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        problems.append("spec.names.listKind: Invalid value: kind and listKind may not be the "
                        "same")
    versions = spec.get("versions", [])
    if sum(bool(v.get("storage")) for v in versions) != 1:
        problems.append("spec.versions: Invalid value: must have exactly one version marked as "
                        "storage version")
    version_names = [v.get("name", "") for v in versions]
    if len(set(version_names)) != len(version_names):
        problems.append("spec.versions: Invalid value: must contain unique version names")
    problems += [f"spec.versions[{j}].name: Invalid value: {json.dumps(n)}"
                 for j, n in enumerate(version_names) if not _DNS1035.fullmatch(n)]
    if spec.get("preserveUnknownFields"):
        problems.append("spec.preserveUnknownFields: Invalid value: true: must be false in "
                        "order to use defaults in the schema")
    return problems


def _version_problems(version: dict, p: str) -> list[str]:
    problems = []
    scale = (version.get("subresources") or {}).get("scale")
    if scale:
        for key, prefixes in (("specReplicasPath", (".spec.",)),
                              ("statusReplicasPath", (".status.",)),
                              ("labelSelectorPath", (".spec.", ".status."))):
            value = scale.get(key)
            if value is None and key == "labelSelectorPath":
                continue
            if not value or not value.startswith(prefixes):
                problems.append(f"{p}.subresources.scale.{key}: Invalid value: "
                                f"{json.dumps(value)}: should be a json path under "
                                f"{' or '.join(prefixes)}")
    for j, col in enumerate(version.get("additionalPrinterColumns") or []):
        where = f"{p}.additionalPrinterColumns[{j}]"
        if col.get("type") not in ("integer", "number", "string", "boolean", "date"):
            problems.append(f"{where}.type: Invalid value: {json.dumps(col.get('type'))}")
        if not str(col.get("jsonPath", "")).startswith("."):
            problems.append(f"{where}.jsonPath: Invalid value: must be a simple json path "
                            f"starting with .")
        if col.get("format") not in (None, "int32", "int64", "float", "double", "byte", "date",
                                     "date-time", "password"):
            problems.append(f"{where}.format: Invalid value: {json.dumps(col.get('format'))}")
    return problems
