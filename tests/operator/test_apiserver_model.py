"""The model of what a real API server checks when a CRD is created
(tests/operator/apiserver_model/): each test holds it to behaviour read from the Kubernetes
sources, cost figures included."""

from __future__ import annotations

import copy

import pytest
from apiserver_model import (
    MAX_REQUEST,
    RuleCost,
    cost_problems,
    crd_problems,
    default_problems,
    rule_costs,
    rule_problems,
    structure_problems,
)
from apiserver_model.quantity import canonical
from apiserver_model.writes import canonicalize, merge_patch, too_long


def obj(props: dict, **extra) -> dict:
    return {"type": "object", "properties": props, **extra}


def ruled(schema: dict, *rules: str) -> dict:
    return {**schema, "x-kubernetes-validations": [{"rule": r} for r in rules]}


def root(**props) -> dict:
    return obj(props)


def costs(schema: dict) -> list[RuleCost]:
    found = rule_costs(schema)
    assert all(isinstance(c, RuleCost) for c in found), found
    return found


# --- defaults: validated as written, against their own node's rules ------------------------

ENGINE = {"maxNumSeqs": {"type": "integer", "minimum": 1}}


def test_rule_reading_an_optional_field_of_a_defaulted_object_is_reported():
    engine = ruled(obj(ENGINE, default={}), "self.maxNumSeqs >= 1")
    problems = default_problems(root(engine=engine))
    assert len(problems) == 1
    assert problems[0].startswith("openAPIV3Schema.properties[engine].default:")
    assert "no such key: maxNumSeqs" in problems[0]
    assert "self.maxNumSeqs >= 1" in problems[0]


def test_the_guarded_form_is_accepted():
    engine = ruled(obj(ENGINE, default={}), "!has(self.maxNumSeqs) || self.maxNumSeqs >= 1")
    assert default_problems(root(engine=engine)) == []


def test_the_pattern_the_real_server_rejected_is_reported():
    tp = {"type": "integer", "default": 1}
    engine = ruled(obj({"tensorParallelSize": tp}, default={}),
                   "self.tensorParallelSize in [1, 2, 4, 8]")
    spec = obj({"engine": engine}, default={})
    problems = default_problems(root(spec=spec))
    assert problems == [
        'openAPIV3Schema.properties[spec].properties[engine].default: Invalid value: {}: '
        'no such key: tensorParallelSize evaluating rule: "self.tensorParallelSize in [1, 2, 4, 8]"'
    ]
    # The nested default is what the server does not apply: written out, the default passes.
    engine["default"] = {"tensorParallelSize": 1}
    assert default_problems(root(spec=spec)) == []


def test_rules_of_nested_nodes_present_in_a_default_are_evaluated():
    engine = ruled(obj(ENGINE), "self.maxNumSeqs >= 1")
    spec = obj({"engine": engine}, default={"engine": {}})
    problems = default_problems(root(spec=spec))
    assert len(problems) == 1
    assert problems[0].startswith("openAPIV3Schema.properties[spec].default.engine:")
    assert "no such key: maxNumSeqs" in problems[0]


def test_a_spec_rule_reaching_into_a_missing_child_is_reported():
    spec = ruled(obj({"resources": obj({"gpus": {"type": "integer"}})}, default={}),
                 "!has(self.resources.gpus) || self.resources.gpus >= 1")
    assert "no such key: resources" in default_problems(root(spec=spec))[0]
    spec = ruled(obj({"resources": obj({"gpus": {"type": "integer"}})}, default={}),
                 "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus >= 1")
    assert default_problems(root(spec=spec)) == []


def test_a_false_rule_on_a_default_reports_its_message():
    node = obj({"n": {"type": "integer"}}, default={"n": 0},
               **{"x-kubernetes-validations": [{"rule": "self.n > 0", "message": "n must be "
                                                "positive"}]})
    problems = default_problems(root(node=node))
    assert len(problems) == 1 and "n must be positive" in problems[0]


def test_errors_are_absorbed_the_way_cel_does():
    for rule in ("self.missing > 0 || true", "true || self.missing > 0",
                 "!(self.missing > 0 && false)"):
        node = ruled(obj({"missing": {"type": "integer"}}, default={}), rule)
        assert default_problems(root(node=node)) == [], rule


@pytest.mark.parametrize("prop, default, expected", [
    ({"type": "string", "enum": ["none", "int8"]}, "fp4", "is not one of"),
    ({"type": "string", "pattern": "^[a-z]+$"}, "UPPER", "does not match"),
    ({"type": "integer", "minimum": 1}, 0, "less than the minimum"),
    ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, 0, "less than or equal"),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 1}, ["a", "b"], "too long"),
])
def test_a_default_violating_its_own_schema_is_reported(prop, default, expected):
    problems = default_problems(root(field={**prop, "default": default}))
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith("openAPIV3Schema.properties[field].default:")


def test_a_nested_violation_inside_an_object_default_is_reported():
    node = obj({"mode": {"type": "string", "enum": ["a", "b"]}}, default={"mode": "c"})
    problems = default_problems(root(node=node))
    assert len(problems) == 1 and "default.mode" in problems[0]


def test_schema_errors_in_a_default_come_before_its_rules():
    node = ruled(obj({"mode": {"type": "string", "enum": ["a"]}}, default={"mode": "c"}),
                 "self.missing == 1")
    node["properties"]["missing"] = {"type": "integer"}
    problems = default_problems(root(node=node))
    assert len(problems) == 1 and "is not one of" in problems[0]


def test_a_default_with_fields_pruning_would_drop_is_reported():
    node = obj({"a": {"type": "string"}}, default={"b": "x"})
    assert "must not have unknown fields" in default_problems(root(node=node))[0]
    node[("x-kubernetes-preserve-unknown-fields")] = True
    assert default_problems(root(node=node)) == []


def test_defaults_under_additional_properties_are_not_checked_at_creation():
    values = {"type": "string", "enum": ["a"], "default": "zzz"}
    assert default_problems(root(m={"type": "object", "additionalProperties": values})) == []


# --- compiling rules against their node's type ------------------------------------------------

SPEC = obj({"replicas": {"type": "integer"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "args": {"type": "array", "items": {"type": "string"}},
            "resources": obj({"gpus": {"type": "integer"}})})


@pytest.mark.parametrize("rule, field", [
    ("self.replica > 0", "replica"),
    ("has(self.resources.gpu)", "gpu"),
    ("self.resources.gpus.x == 1", None),
    ("self.nope.all(x, true)", "nope"),
])
def test_a_rule_selecting_an_undeclared_field_is_reported(rule, field):
    problems = rule_problems(root(spec=ruled(SPEC, rule)))
    assert len(problems) == 1 and "compilation failed" in problems[0], problems
    assert "properties[spec].x-kubernetes-validations[0].rule" in problems[0]
    if field:
        assert f"undefined field '{field}'" in problems[0]


@pytest.mark.parametrize("rule", [
    "self.replicas >= 0",
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus >= 0",
    "has(self.labels.app) && self.labels.app != ''",
    "self.labels.all(k, k.startsWith('a') && size(self.labels[k]) < 10)",
    "self.args.exists(a, a == '--x') || size(self.args) == 0",
    "self.args.exists_one(a, a.contains('='))",
    "self.args.map(a, a.lowerAscii()) == self.args",
    "size(self.args.filter(a, a.endsWith('x'))) <= 1",
    "self.replicas in [1, 2] ? self.args[0].matches('^a') : true",
])
def test_well_typed_rules_compile(rule):
    assert rule_problems(root(spec=ruled(SPEC, rule))) == []


def test_rules_on_map_and_list_nodes_compile():
    labels = ruled(SPEC["properties"]["labels"], "size(self) <= 8",
                   "self.all(k, k.matches('^[a-z]+$'))")
    args = ruled(SPEC["properties"]["args"], "self.all(a, a.startsWith('--'))")
    assert rule_problems(root(labels=labels, args=args)) == []


def test_preserve_unknown_fields_exposes_no_field_to_cel():
    free = ruled({"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                 "has(self.nodeAffinity)")
    assert "undefined field 'nodeAffinity'" in rule_problems(root(affinity=free))[0]


@pytest.mark.parametrize("rule, expected", [
    ("self.replicas", "must evaluate to a bool"),
    ("self.replicas == 'one'", "no matching overload"),
    ("self.args.all(a, a)", "no matching overload"),
    ("self.replicas.matches('x')", "no matching overload"),
    ("self.labels.matches('x')", "no matching overload"),
    ("self.replicas >", "syntax error"),
    (r"self.args[0].matches('a\.b')", "invalid escape"),
    ("self.args[0].matches('(?=a)')", "RE2"),
])
def test_ill_typed_or_malformed_rules_are_reported(rule, expected):
    problems = rule_problems(root(spec=ruled(SPEC, rule)))
    assert len(problems) == 1 and expected in problems[0], problems


@pytest.mark.parametrize("rule", [r"self.matches('a[.]b')", r"self.matches(r'a\.b')",
                                  r"self.matches('a\\.b')"])
def test_escaped_dots_cel_accepts(rule):
    assert rule_problems(root(s=ruled({"type": "string"}, rule))) == []


def test_old_self_only_where_values_correlate():
    item = ruled(obj({"name": {"type": "string"}}), "self.name == oldSelf.name")
    atomic = {"type": "array", "items": item}
    keyed = {"type": "array", "items": {**item, "required": ["name"]},
             "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    assert "uncorrelatable" in rule_problems(root(l=atomic))[0]
    assert rule_problems(root(l=keyed)) == []


@pytest.mark.parametrize("rule, message, expected", [
    ("  ", None, "rule is not specified"),
    ("self > 0", " ", "message must be non-empty"),
    ("self > 0", "two\nlines", "line breaks"),
    ("self > 0 &&\nself < 9", None, "message must be specified"),
])
def test_rule_text_checks(rule, message, expected):
    entry = {"rule": rule} | ({"message": message} if message is not None else {})
    node = {"type": "integer", "x-kubernetes-validations": [entry]}
    assert any(expected in p for p in rule_problems(root(n=node)))


# --- static cost --------------------------------------------------------------------------------

def unbounded_cost(rule_schema: dict) -> int:
    return costs(root(v=rule_schema))[0].cost


# Figures from Kubernetes' own TestCostEstimation (apiextensions-apiserver cel/compilation_test.go).
@pytest.mark.parametrize("schema, rule, expected", [
    ({"type": "array", "items": {"type": "number"}}, "self.all(x, true)", 4718591),
    ({"type": "array", "items": {"type": "number"}, "maxItems": 10}, "self.all(x, true)", 32),
    ({"type": "array", "items": {"type": "string"}}, "self.all(x, true)", 3145727),
    ({"type": "array", "items": obj({"required": {"type": "string"},
                                     "optional": {"type": "string"}}, required=["required"])},
     "self.all(x, true)", 555128),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "self.all(x, true)",
     1179647),
    ({"type": "object", "additionalProperties": {"type": "boolean"}}, "self.all(x, true)",
     943718),
    ({"type": "string"}, "self.contains('test')", 314574),
    ({"type": "string", "maxLength": 10}, "self.contains('test')", 5),
    ({"type": "string"}, 'size(self + "hello") > size("hello")', 314578),
    ({"type": "string"}, 'self.matches("x")', 314574),
    ({"type": "string", "maxLength": 50}, 'self.matches("x")', 22),
    ({"type": "string"}, '"".matches("(((((((((())))))))))[0-9]")', 7),
    ({"type": "string", "maxLength": 0}, 'self == "x"', 1),
    ({"type": "array", "items": {"type": "number"}, "maxItems": 10},
     "self.all(x, self.all(y, self.all(z, true)))", 3552),
    ({"type": "object", "additionalProperties": {"type": "string"}},
     "self.all(x, x.contains(self[x]))", 2752507),
    ({"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}}},
     "self.all(x, x.y == 25.2)", 6291452),
    ({"type": "array", "items": {"type": "string", "format": "date-time"}},
     "self.all(x, true)", 428963),
    ({"type": "object", "additionalProperties": {"type": "string", "format": "duration"}},
     "self.all(x, true)", 1048577),
    ({"type": "string", "enum": ["A", "B", "C", "LongValue"]}, "self.contains('A')", 2),
    ({"type": "object", "additionalProperties": {"type": "integer"}},
     "oldSelf.size() == self.size()", 5),
])
def test_costs_agree_with_kubernetes(schema, rule, expected):
    assert unbounded_cost(ruled(schema, rule)) == expected


MATCH = "self.all(x, x.matches('^[a-z]+$'))"


def test_matches_over_an_unbounded_list_of_strings_is_over_budget():
    strings = ruled({"type": "array", "items": {"type": "string"}}, MATCH)
    problems = cost_problems(root(args=strings))
    assert "estimated rule cost exceeds budget" in problems[0]
    assert problems[0].startswith("openAPIV3Schema.properties[args].x-kubernetes-validations[0]")
    assert "entire OpenAPIv3 schema" in problems[-1]  # alone it also breaks the CRD's total


def test_the_same_rule_with_small_bounds_is_accepted():
    strings = ruled({"type": "array", "items": {"type": "string", "maxLength": 64},
                     "maxItems": 10}, MATCH)
    assert cost_problems(root(args=strings)) == []
    # 10 items x (loop 3 + x 1 + ceil((64*4 + 1) * 0.1) * ceil(8 * 0.25)) + 2
    assert unbounded_cost(strings) == 10 * (3 + 1 + 26 * 2) + 2


KEY_RULE = "self.all(k, k.matches('^[a-z]+$'))"
LABEL_KEY = ("self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*"
             "[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))")


def string_map(rule: str, **bounds) -> dict:
    values = {"type": "string"} | ({"maxLength": bounds.pop("maxLength")}
                                   if "maxLength" in bounds else {})
    return ruled({"type": "object", "additionalProperties": values, **bounds}, rule)


def test_map_keys_are_costed_as_zero_length_strings():
    # Keys are CEL's plain string type (MaxElements 0): per key, loop 2 + accumulator 1 +
    # k 1 + ceil((0 + 1) * 0.1) * ceil(8 * 0.25); the map holds (3 MiB - 2) / (2 + 6) keys.
    per_key = 2 + 1 + 1 + 1 * 2
    keys = (MAX_REQUEST - 2) // 8
    assert unbounded_cost(string_map(KEY_RULE)) == keys * per_key + 2
    assert unbounded_cost(string_map(KEY_RULE, maxLength=63)) == keys * per_key + 2
    assert unbounded_cost(string_map(KEY_RULE, maxProperties=16)) == 16 * per_key + 2
    assert cost_problems(root(labels=string_map(KEY_RULE))) == []


def test_a_long_key_pattern_needs_max_properties():
    assert "exceeds budget" in cost_problems(root(labels=string_map(LABEL_KEY)))[0]
    assert cost_problems(root(labels=string_map(LABEL_KEY, maxProperties=64))) == []


def test_map_values_are_sized_by_their_max_length():
    rule = "self.all(k, self[k].matches('^[a-z]+$'))"
    assert "exceeds budget" in cost_problems(root(m=string_map(rule, maxProperties=16)))[0]
    assert cost_problems(root(m=string_map(rule, maxProperties=16, maxLength=63))) == []


def test_cardinality_is_the_product_of_the_bounds_above_a_rule():
    item = ruled(obj({"name": {"type": "string", "maxLength": 10}}), "self.name != ''")
    inner = {"type": "array", "items": item, "maxItems": 3}
    bounded = {"type": "array", "items": obj({"inner": inner}), "maxItems": 5}
    [c] = costs(root(outer=bounded))
    assert (c.cardinality, c.total) == (15, 15 * c.cost)
    unbounded = {"type": "array", "items": obj({"inner": inner})}
    [c] = costs(root(outer=unbounded))
    assert c.cardinality == MAX_REQUEST // (2 + 1)  # the item object serializes to {} at least


def test_the_crd_total_limit_is_enforced():
    # Each rule: 1 + 1 (self.a) + 1 + 1 (self.b) + ceil(8000 * 0.1) = 804, run 10,000 times.
    item = obj({"a": {"type": "string", "maxLength": 2000},
                "b": {"type": "string", "maxLength": 2000}})
    rules = ruled(item, *["self.a == self.b"] * 13)
    schema = root(l={"type": "array", "items": rules, "maxItems": 10000})
    assert {c.total for c in costs(schema)} == {8_040_000}
    problems = cost_problems(schema)
    assert "exceeds budget" in problems[-1] and "entire OpenAPIv3 schema" in problems[-1]
    rules["x-kubernetes-validations"] = rules["x-kubernetes-validations"][:12]
    assert cost_problems(schema) == []


def test_constructs_outside_the_model_are_reported_not_costed():
    node = ruled({"type": "string"}, "self.split(',').size() > 0")
    problems = cost_problems(root(s=node))
    assert len(problems) == 1 and "not modelled" in problems[0]
    assert "not modelled" in rule_problems(root(s=node))[0]


# --- structure ------------------------------------------------------------------------------

@pytest.mark.parametrize("mutate, expected", [
    (lambda s: s["properties"]["spec"].pop("type"), "must not be empty for specified object"),
    (lambda s: s["properties"]["spec"]["properties"].update(x={"$ref": "#/x"}), "$ref"),
    (lambda s: s["properties"]["spec"].update(additionalProperties={"type": "string"}),
     "mutual exclusive"),
    (lambda s: s["properties"].update(metadata=obj({"labels": {"type": "object"}})),
     "must not specify anything other than name and generateName"),
    (lambda s: s["properties"].update(metadata={"type": "object", "default": {}}),
     "must not be set in top-level metadata"),
    (lambda s: s["properties"]["spec"]["properties"].update(
        l={"type": "array", "items": {"type": "string"}, "uniqueItems": True}), "uniqueItems"),
    (lambda s: s["properties"]["spec"]["properties"].update(l={"type": "array"}),
     "items: Required value"),
    (lambda s: s["properties"]["spec"]["properties"].update(
        l={"type": "array", "items": {"description": "x"}}), "for specified array items"),
    (lambda s: s.update(type="array"), "must be object at the root"),
    (lambda s: s["properties"]["spec"].update({"x-kubernetes-preserve-unknown-fields": False}),
     "must be true or undefined"),
])
def test_structural_problems_are_reported(mutate, expected):
    schema = root(metadata={"type": "object"}, spec=obj({"a": {"type": "string"}}))
    assert structure_problems(schema) == []
    mutate(schema)
    assert any(expected in p for p in structure_problems(schema)), structure_problems(schema)


def test_free_form_and_int_or_string_nodes_need_no_type():
    schema = root(a={"x-kubernetes-preserve-unknown-fields": True},
                  b={"x-kubernetes-int-or-string": True})
    assert structure_problems(schema) == []


# --- the whole CRD ------------------------------------------------------------------------------

GOOD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.io"},
    "spec": {
        "group": "example.io", "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget",
                  "listKind": "WidgetList", "shortNames": ["wd"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                     "statusReplicasPath": ".status.replicas"}},
            "additionalPrinterColumns": [{"name": "Replicas", "type": "integer",
                                          "jsonPath": ".spec.replicas"}],
            "schema": {"openAPIV3Schema": {
                "type": "object", "description": "A widget.",
                "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {
                        "type": "object", "default": {},
                        "properties": {
                            "replicas": {"type": "integer", "default": 1, "minimum": 0},
                            "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                            "tags": {"type": "array", "maxItems": 8,
                                     "items": {"type": "string", "maxLength": 63},
                                     "x-kubernetes-validations": [{
                                         "rule": "self.all(t, t.matches('^[a-z]+$'))",
                                         "message": "tags are lowercase words"}]},
                            "labels": {"type": "object", "maxProperties": 16,
                                       "additionalProperties": {"type": "string"}},
                        },
                        "x-kubernetes-validations": [{
                            "rule": "!has(self.replicas) || !has(self.mode) || "
                                    "self.mode == 'a' || self.replicas <= 1",
                            "message": "mode b runs one replica"}],
                    },
                    "status": obj({"replicas": {"type": "integer"}}),
                },
                "x-kubernetes-validations": [{"rule": "size(self.metadata.name) <= 63"}],
            }},
        }],
    },
}


def test_a_well_formed_crd_has_no_problems():
    assert crd_problems(GOOD) == []


def test_crd_problems_names_each_stage():
    crd = copy.deepcopy(GOOD)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    spec["x-kubernetes-validations"][0]["rule"] = "self.replicas <= 1"
    spec["properties"]["tags"].pop("maxItems")
    spec["properties"]["tags"]["items"].pop("maxLength")
    spec["properties"]["labels"]["x-kubernetes-validations"] = [{"rule": "self.nope"}]
    crd["metadata"]["name"] = "widgets"
    problems = crd_problems(crd)
    assert problems[0].startswith("metadata.name")
    base = "spec.versions[0].schema.openAPIV3Schema.properties[spec]"
    assert any(p.startswith(f"{base}.default") and "no such key: replicas" in p
               for p in problems)
    assert any(p.startswith(f"{base}.properties[labels].x-kubernetes-validations[0].rule")
               for p in problems)
    assert any(p.startswith(f"{base}.properties[tags].x-kubernetes-validations[0].rule: "
                            "Forbidden: estimated rule cost") for p in problems)


# --- quantities: stored canonically (apimachinery resource.Quantity.String()) ----------------

# Pairs from the issue's observations on a real server and from apimachinery's quantity_test.go
# (TestQuantityParse, TestQuantityString, TestQuantityParseEmit).
CANONICAL = [
    ("1000m", "1"), ("4096Mi", "4Gi"), ("0.5", "500m"), ("1.5Gi", "1536Mi"), (2, "2"),
    (0.5, "500m"), ("100M", "100M"), ("1000M", "1G"), ("1024Mi", "1Gi"), ("1Ki", "1Ki"),
    ("1e3", "1e3"),  # an exponent stays an exponent (DecimalExponent keeps its format)
    ("1.2e3", "1200"), ("1.3E+6", "1300e3"), ("1.5Ki", "1536"), ("0.5Mi", "512Ki"),
    (".001Ki", "1024m"), (".000000000001Ki", "2n"), ("3.001n", "4n"), ("0Mi", "0"),
    ("-1000m", "-1"), ("1.", "1"), ("100.035k", "100035"), ("9Ei", "9223372036854775807"),
]


@pytest.mark.parametrize(("written", "stored"), CANONICAL)
def test_quantities_are_stored_canonically(written, stored):
    assert canonical(written) == stored
    assert canonical(stored) == stored  # what is read back is written back unchanged


@pytest.mark.parametrize("bad", ["1.1.M", "0.1mi", "aoeu", "1i", " 1", ""])
def test_malformed_quantities_are_refused(bad):
    with pytest.raises(ValueError):
        canonical(bad)


def test_writes_canonicalize_every_container_and_the_empty_dir_size():
    pod = {"containers": [{"resources": {"requests": {"cpu": "1000m"},
                                         "limits": {"memory": "4096Mi", "x.io/gpu": 1}},
                           "env": [{"name": "A", "value": "1000m"}, {"name": "B", "valueFrom": {
                               "resourceFieldRef": {"resource": "limits.cpu", "divisor": 1}}}]}],
           "initContainers": [{"resources": {"limits": {"cpu": "0.5"}}}],
           "volumes": [{"emptyDir": {"sizeLimit": "2048Mi"}}, {"emptyDir": {}}]}
    deployment = {"spec": {"template": {"spec": copy.deepcopy(pod)}}}
    canonicalize("Deployment", deployment)
    written = deployment["spec"]["template"]["spec"]
    assert written["containers"][0]["resources"] == {
        "requests": {"cpu": "1"}, "limits": {"memory": "4Gi", "x.io/gpu": "1"}}
    assert written["initContainers"][0]["resources"]["limits"] == {"cpu": "500m"}
    assert written["containers"][0]["env"] == [  # a value is a string, a divisor a quantity
        {"name": "A", "value": "1000m"},
        {"name": "B", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu",
                                                         "divisor": "1"}}}]
    assert written["volumes"] == [{"emptyDir": {"sizeLimit": "2Gi"}}, {"emptyDir": {}}]
    pdb = {"spec": {"minAvailable": "50%", "maxUnavailable": 1}}  # IntOrString: not a quantity
    canonicalize("PodDisruptionBudget", pdb)
    assert pdb == {"spec": {"minAvailable": "50%", "maxUnavailable": 1}}


def test_annotations_over_256_kib_in_total_are_too_long():
    at_limit = {"a": "x" * (256 * 1024 - 1)}
    assert too_long("InferenceService", {"metadata": {"annotations": at_limit}}) == []
    over = {"a": "x" * (256 * 1024 - 1), "b": ""}  # keys count too
    assert too_long("Deployment", {"metadata": {"annotations": over}}) == [
        "metadata.annotations"]
    template = {"spec": {"template": {"metadata": {"annotations": over}}}}
    assert too_long("Deployment", template) == ["spec.template.metadata.annotations"]
    assert merge_patch({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}) == {
        "a": 1, "b": {"d": 3}}
