"""What a real kube-apiserver checks when a CustomResourceDefinition is created, as pure functions
of the CRD: no API server can run here, and the emulator the operator tests use checks nothing.

Each check follows the Kubernetes sources (master: the code paths of 1.30 and later, with strict
cost, validation ratcheting and selectable fields) and the cel-go they vendor; each module names
the files it follows. The cost model reproduces the figures Kubernetes asserts in
cel/compilation_test.go (TestCostEstimation).

The real server reports in stages (structure, then defaults, then CEL compilation and cost);
crd_problems reports every stage at once. Only the CEL subset our CRDs use is modelled; anything
else is reported as a problem, never costed as zero. Not modelled: string formats (validated and
seen by CEL as plain strings), messageExpression, optionalOldSelf, the runtime cost budgets,
NewStructural's conversion errors and the completeness of value validations (allOf etc.).

Modules, each importing only those before it: saturating and re2 (Go's arithmetic and regexp),
schema (the walk), cel_types, cel_syntax, cel_check (types and cost of a rule), cel_eval, then
one per stage: structure, defaults, rules, cel_cost; crd ties them together.

Apart from CRD creation, quantity (the canonical form the server stores a quantity in) and writes
(what it does to every object written: canonical quantities, the annotation size limit) model
what the server does to objects; the emulator the operator tests run against applies them.
"""

from .cel_cost import RuleCost, cost_problems, rule_costs
from .cel_types import MAX_REQUEST
from .crd import crd_problems
from .defaults import default_problems
from .rules import rule_problems
from .structure import structure_problems

__all__ = ["MAX_REQUEST", "RuleCost", "cost_problems", "crd_problems", "default_problems",
           "rule_costs", "rule_problems", "structure_problems"]
