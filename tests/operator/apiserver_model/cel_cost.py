"""The static cost limits on rules (apiextensions-apiserver validation.go):
StaticEstimatedCostLimit (10,000,000) for each rule's cost *times its cardinality*,
StaticEstimatedCRDCostLimit (100,000,000) for the sum over one version's schema.
cel_validation.go: where a list or map above the rule has no bound, the cardinality is the
rule's own estimate (compilation.go: 3 MiB / (min serialized size of the node + 1))."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .cel_check import compile_rule
from .cel_syntax import CompileError, Unsupported
from .cel_types import MAX_REQUEST, decl_of
from .saturating import add, mul
from .schema import RULES, walk

PER_RULE_LIMIT = 10_000_000
CRD_LIMIT = 100_000_000


@dataclass
class RuleCost:
    """One rule's static cost: `cost` is the compiler's estimate for one evaluation,
    `cardinality` how many times it can run in one object, `total` their product."""

    path: str
    rule: str
    cost: int
    cardinality: int
    total: int


def rule_costs(schema: dict, path: str = "openAPIV3Schema") -> list[RuleCost | str]:
    """The static cost of every rule that compiles; a rule outside the modelled subset of CEL
    appears as a message instead of a cost."""
    costs: list[RuleCost | str] = []
    for node in walk(schema, path):
        decl = decl_of(node.schema, node.root)
        for i, rule in enumerate(node.schema.get(RULES) or []):
            where = f"{node.path}.x-kubernetes-validations[{i}]"
            if "messageExpression" in rule:
                costs.append(f"{where}.messageExpression: cost not modelled")
            if decl is None:
                continue
            try:
                compiled = compile_rule(rule.get("rule", ""), decl)
            except CompileError:
                continue
            except Unsupported as err:
                costs.append(f"{where}.rule: cost not modelled: {err} in "
                             f"{json.dumps(rule.get('rule'))}")
                continue
            times = node.cardinality
            if times is None:
                times = MAX_REQUEST // (decl.min_size + 1)
            total = 0 if compiled.cost == 0 else mul(compiled.cost, times)
            costs.append(RuleCost(f"{where}.rule", rule["rule"], compiled.cost, times, total))
    return costs


def cost_problems(schema: dict, path: str = "openAPIV3Schema") -> list[str]:
    """Rules over StaticEstimatedCostLimit (cost times cardinality), the schema over
    StaticEstimatedCRDCostLimit, and rules whose cost this model cannot estimate."""
    problems, total, expensive = [], 0, []
    for c in rule_costs(schema, path):
        if isinstance(c, str):
            problems.append(c)
            continue
        if c.total > PER_RULE_LIMIT:
            problems.append(f"{c.path}: Forbidden: estimated rule cost exceeds budget by factor "
                            f"of {_factor_text(c.total, PER_RULE_LIMIT)} (cost {c.cost} x "
                            f"{c.cardinality} evaluations = {c.total}; try simplifying the "
                            f"rule, or adding maxItems, maxProperties, and maxLength where "
                            f"arrays, maps, and strings are declared)")
        total = add(total, c.total)
        if c.total >= CRD_LIMIT // 100:
            expensive.append(c)
    if total > CRD_LIMIT:
        top = sorted(expensive, key=lambda c: -c.total)[:4]
        problems += [f"{c.path}: Forbidden: contributed to estimated rule cost total exceeding "
                     f"cost limit for entire OpenAPIv3 schema" for c in top]
        problems.append(f"{path}: Forbidden: x-kubernetes-validations estimated rule cost total "
                        f"for entire OpenAPIv3 schema exceeds budget by factor of "
                        f"{_factor_text(total, CRD_LIMIT)} (total {total})")
    return problems


def _factor_text(cost: int, limit: int) -> str:
    factor = cost / limit
    if factor > 100:
        return "more than 100x"
    return f"{factor:f}x" if factor < 1.5 else f"{factor:.1f}x"
