"""What a real kube-apiserver checks when a CustomResourceDefinition is created, as pure functions
of the CRD: no API server can run here, and the emulator the operator tests use checks nothing.

Each check follows the Kubernetes sources (master: the code paths of 1.30 and later, with strict
cost, validation ratcheting and selectable fields) and the cel-go they vendor; the cost model
reproduces the figures Kubernetes asserts in cel/compilation_test.go (TestCostEstimation):

- apiextensions-apiserver pkg/apis/apiextensions/validation/validation.go: schema keywords,
  defaults forbidden in top-level metadata, rule text checks, oldSelf only where values
  correlate, and the two cost limits: StaticEstimatedCostLimit (10,000,000) for each rule's cost
  *times its cardinality*, StaticEstimatedCRDCostLimit (100,000,000) for the sum over one
  version's schema. cel_validation.go: the cardinality is the product of maxItems/maxProperties
  of the lists and maps above the rule; if one of them has no bound, the rule's own estimate is
  used (compilation.go: 3 MiB / (min serialized size of the node + 1)).
- pkg/apiserver/schema/validation.go: structural schema (a type on every node, metadata at the
  root may name only name/generateName, no additionalProperties at the root, ...).
- pkg/apiserver/schema/defaulting/validation.go: a default (walked through properties and items,
  never additionalProperties) must survive pruning, must validate against its node's OpenAPI
  schema, and only then must pass the CEL rules of that node and of the nested nodes present in
  the default, evaluated on the default exactly as written (oldSelf = the default, no nested
  defaulting). cel/validation.go: a missing field is the error "no such key: <field>".
- apiserver pkg/cel/common/schemas.go: CEL types and size estimates. Strings: maxLength*4, else
  the longest enum value, else 3 MiB - 2; lists without maxItems: (3 MiB - 2) / (item min size
  + 1); maps without maxProperties: (3 MiB - 2) / (value min size + 6). Map keys are the plain
  CEL string type whose size estimate is 0, whatever the map's bounds. x-kubernetes-preserve-
  unknown-fields exposes no field to CEL: a free-form object is an object with no fields.
- apiserver pkg/cel/library/cost.go and cel-go checker/cost.go, common/cost.go: call costs
  (string traversal 0.1 per character, regex 0.25 per pattern character, (size + 1) for the
  matched string); environment/base.go: has() costs only its operand (PresenceTestHasCost false).
- apiserver pkg/cel/limits.go and pkg/apis/cel/config.go: the 3 MiB request size and the JSON
  sizes of the string formats.

The real server reports in stages (structure, then defaults, then CEL compilation and cost);
crd_problems reports every stage at once. Only the CEL subset our CRDs use is modelled; anything
else is reported as a problem, never costed as zero. Not modelled: string formats (validated and
seen by CEL as plain strings), messageExpression, optionalOldSelf, the runtime cost budgets,
NewStructural's conversion errors and the completeness of value validations (allOf etc.).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema

MAX_REQUEST = 3 * 1024 * 1024
PER_RULE_LIMIT = 10_000_000
CRD_LIMIT = 100_000_000
U64 = 2**64 - 1
STRING_FACTOR = 0.1
REGEX_FACTOR = 0.25
LIST_CREATE = 10
MAP_CREATE = 30


# --- CEL types of schema nodes (common/schemas.go) -------------------------------------------

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
EMBEDDED = "x-kubernetes-embedded-resource"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
INT_OR_STRING = "x-kubernetes-int-or-string"
RULES = "x-kubernetes-validations"


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


def _unescape(name: str) -> str:
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


# --- CEL syntax: celpy's parse tree as a small AST --------------------------------------------

@dataclass(frozen=True)
class Node:
    op: str
    args: tuple = ()
    value: Any = None


class Unsupported(Exception):
    """A CEL construct this model does not cover (reported, never costed as zero)."""


class CompileError(Exception):
    """What the API server's CEL compiler would reject."""


_PARSER = celpy.CELParser()
_BINARY = {"relation_lt": "<", "relation_le": "<=", "relation_gt": ">", "relation_ge": ">=",
           "relation_eq": "==", "relation_ne": "!=", "relation_in": "in", "addition_add": "+",
           "addition_sub": "-", "multiplication_mul": "*", "multiplication_div": "/",
           "multiplication_mod": "%"}
_MACROS = {"all", "exists", "exists_one", "map", "filter"}
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?"}


def parse(text: str) -> Node:
    try:
        tree = _PARSER.parse(text)
    except Exception as err:
        raise CompileError(f"syntax error: {str(err).splitlines()[0]}") from None
    return _ast(tree)


def _ast(t: Any) -> Node:
    name, kids = t.data, [k for k in t.children if k is not None]
    if name == "expr":
        return _ast(kids[0]) if len(kids) == 1 else Node("?:", tuple(map(_ast, kids)))
    if name in ("conditionalor", "conditionaland"):
        if len(kids) == 1:
            return _ast(kids[0])
        return Node("||" if name == "conditionalor" else "&&", (_ast(kids[0]), _ast(kids[1])))
    if name in ("relation", "addition", "multiplication"):
        if len(kids) == 1:
            return _ast(kids[0])
        return Node(_BINARY[kids[0].data], (_ast(kids[0].children[0]), _ast(kids[1])))
    if name == "unary":
        if len(kids) == 1:
            return _ast(kids[0])
        return Node("!" if kids[0].data == "unary_not" else "neg", (_ast(kids[1]),))
    if name in ("member", "primary", "paren_expr"):
        return _ast(kids[0])
    if name == "member_dot":
        return Node("select", (_ast(kids[0]),), str(kids[1]))
    if name == "member_dot_arg":
        return _call(str(kids[1]), _ast(kids[0]), _exprs(kids[2:]))
    if name == "ident_arg":
        return _call(str(kids[0]), None, _exprs(kids[1:]))
    if name == "member_index":
        return Node("index", (_ast(kids[0]), _ast(kids[1])))
    if name == "ident":
        return Node("ident", value=str(kids[0]))
    if name == "list_lit":
        return Node("list", tuple(_exprs(kids)))
    if name == "map_lit":
        return Node("map", tuple(_exprs(kids)))
    if name == "literal":
        return _literal(kids[0])
    raise Unsupported(name.replace("_", " "))


def _exprs(kids: list) -> list[Node]:
    return [_ast(e) for e in kids[0].children] if kids else []


def _call(fn: str, target: Node | None, args: list[Node]) -> Node:
    if fn == "has" and target is None:
        if len(args) != 1 or args[0].op != "select":
            raise CompileError("invalid argument to has() macro")
        return Node("has", args[0].args, args[0].value)
    if fn in _MACROS and target is not None and len(args) == 2:
        if args[0].op != "ident":
            raise CompileError("argument must be a simple name")
        return Node("comp", (target, args[1]), (fn, args[0].value))
    if fn in _MACROS and target is not None:
        raise Unsupported(f"{fn}() with {len(args)} arguments")
    return Node("call", ((target,) if target else ()) + tuple(args), (fn, target is not None))


def _literal(token: Any) -> Node:
    kind, text = token.type, str(token)
    if kind == "INT_LIT":
        return Node("lit", value=("int", _int(text)))
    if kind == "UINT_LIT":
        return Node("lit", value=("uint", _int(text[:-1])))
    if kind == "FLOAT_LIT":
        return Node("lit", value=("double", float(text)))
    if kind in ("STRING_LIT", "MLSTRING_LIT"):
        return Node("lit", value=("string", _unquote(text)))
    if kind == "BYTES_LIT":
        return Node("lit", value=("bytes", _unquote(text[1:]).encode()))
    if kind == "BOOL_LIT":
        return Node("lit", value=("bool", text == "true"))
    return Node("lit", value=("null", None))


def _int(text: str) -> int:
    return int(text, 16) if "x" in text.lower() else int(text)


def _unquote(text: str) -> str:
    raw = text[0] in "rR"
    text = text[1:] if raw else text
    q = 3 if text[:3] in ('"""', "'''") else 1
    body = text[q:-q]
    if raw:
        return body
    out, i = [], 0
    while i < len(body):
        if body[i] != "\\":
            out.append(body[i])
            i += 1
            continue
        c = body[i + 1]
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
            i += 2
        elif c in "xXuU":
            width = {"x": 2, "X": 2, "u": 4, "U": 8}[c]
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        elif c in "0123":
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
        else:
            raise CompileError(f"invalid escape sequence \\{c}")
    return "".join(out)


# --- the compile step: type-check and static cost estimate (cel-go checker/cost.go) ---------

def _add(*xs: int) -> int:
    return min(sum(xs), U64)


def _mul(x: int, y: int) -> int:
    return min(x * y, U64)


def _factor(x: int, f: float) -> int:
    product = math.ceil(float(x) * f)
    return U64 if product >= 2**64 else product


@dataclass
class _Info:
    type: Decl
    cost: int
    path: tuple | None = None
    size: int | None = None


@dataclass
class Compiled:
    """A rule as the server's compiler sees it: its worst-case cost and whether it is a
    transition rule."""

    ast: Node
    cost: int
    uses_old_self: bool


def compile_rule(rule: str, decl: Decl) -> Compiled:
    """Type-check `rule` against the node's CEL type and estimate its cost; raises
    CompileError (the server rejects it) or Unsupported (outside this model)."""
    checker = _Checker(decl)
    ast = parse(rule)
    info = checker.visit(ast, {})
    if info.type.kind != "bool":
        raise CompileError("cel expression must evaluate to a bool")
    return Compiled(ast, info.cost, checker.uses_old_self)


_NAMED = ("lit", "ident", "select", "has", "index", "list", "map", "call", "comp")
_CHECK = {"?:": "cond", "&&": "logic", "||": "logic", "!": "unary", "neg": "unary",
          **{op: op for op in _NAMED}}
_EVAL = {**_CHECK, "!": "not", "neg": "neg"}


class _Checker:
    def __init__(self, root: Decl):
        self.root = root
        self.uses_old_self = False

    def size(self, info: _Info) -> int:
        """cel-go's computeSize: computed, else by path, else 1 for scalars, else unknown."""
        if info.size is not None:
            return info.size
        if info.path:
            node: Decl | None = self.root
            for name in info.path[1:]:
                if node is None:
                    break
                if name in ("@items", "@values"):
                    node = node.elem
                elif name == "@keys":
                    node = node.key
                else:
                    node = (node.fields or {}).get(name)
            if node is not None:
                return node.max
        return 1 if info.type.kind in SCALARS else U64

    def visit(self, n: Node, scope: dict) -> _Info:
        return getattr(self, "_" + _CHECK.get(n.op, "binary"))(n, scope)

    def _lit(self, n: Node, scope: dict) -> _Info:
        kind, value = n.value
        decl = {"int": INT, "uint": UINT, "double": DOUBLE, "string": STRING, "bytes": BYTES,
                "bool": BOOL, "null": NULL}[kind]
        return _Info(decl, 0, size=len(value) if kind in ("string", "bytes") else 1)

    def _ident(self, n: Node, scope: dict) -> _Info:
        if n.value in scope:
            decl, path = scope[n.value]
            return _Info(decl, 1, path)
        if n.value in ("self", "oldSelf"):
            self.uses_old_self |= n.value == "oldSelf"
            return _Info(self.root, 1, (n.value,))
        raise CompileError(f"undeclared reference to '{n.value}'")

    def _select(self, n: Node, scope: dict) -> _Info:
        o = self.visit(n.args[0], scope)
        decl = self._field(o.type, n.value)
        extra = 1 if o.type.kind in ("map", "object") else 0
        return _Info(decl, o.cost + extra, o.path + (n.value,) if o.path else None)

    def _has(self, n: Node, scope: dict) -> _Info:
        o = self.visit(n.args[0], scope)
        self._field(o.type, n.value)
        return _Info(BOOL, o.cost)

    def _field(self, t: Decl, name: str) -> Decl:
        if t.kind == "object":
            if name not in (t.fields or {}):
                raise CompileError(f"undefined field '{name}'")
            return t.fields[name]
        if t.kind == "map":
            return t.elem
        if t.kind == "dyn":
            return DYN
        raise CompileError(f"type '{t.kind}' does not support field selection")

    def _index(self, n: Node, scope: dict) -> _Info:
        a, i = self.visit(n.args[0], scope), self.visit(n.args[1], scope)
        if a.type.kind == "list" and i.type.kind in ("int", "uint", "dyn"):
            decl, step = a.type.elem, "@items"
        elif a.type.kind == "map" and i.type.kind in ("string", "dyn"):
            decl, step = a.type.elem, "@values"
        else:
            raise CompileError(f"found no matching overload for '_[_]' applied to "
                               f"'({a.type.kind}, {i.type.kind})'")
        return _Info(decl, _add(1, a.cost, i.cost), a.path + (step,) if a.path else None)

    def _list(self, n: Node, scope: dict) -> _Info:
        items = [self.visit(e, scope) for e in n.args]
        _same(items, "list")
        elem = items[0].type if items else DYN
        return _Info(Decl("list", elem=elem), _add(LIST_CREATE, *(i.cost for i in items)),
                     size=len(items))

    def _map(self, n: Node, scope: dict) -> _Info:
        parts = [self.visit(e, scope) for e in n.args]
        keys, values = parts[0::2], parts[1::2]
        _same(keys, "map key")
        _same(values, "map value")
        decl = Decl("map", elem=values[0].type if values else DYN,
                    key=keys[0].type if keys else DYN)
        return _Info(decl, _add(MAP_CREATE, *(p.cost for p in parts)), size=len(keys))

    def _cond(self, n: Node, scope: dict) -> _Info:
        c, t, f = (self.visit(e, scope) for e in n.args)
        _want(c, "bool", "_?_:_")
        if not _compatible(t.type, f.type):
            raise CompileError(f"found no matching overload for '_?_:_' applied to "
                               f"'(bool, {t.type.kind}, {f.type.kind})'")
        return _Info(t.type, _add(c.cost, max(t.cost, f.cost)),
                     size=max(self.size(t), self.size(f)))

    def _logic(self, n: Node, scope: dict) -> _Info:
        left, right = (self.visit(e, scope) for e in n.args)
        _want(left, "bool", n.op)
        _want(right, "bool", n.op)
        return _Info(BOOL, _add(left.cost, right.cost))

    def _unary(self, n: Node, scope: dict) -> _Info:
        o = self.visit(n.args[0], scope)
        if n.op == "!":
            _want(o, "bool", "!_")
            return _Info(BOOL, _add(1, o.cost))
        if o.type.kind not in ("int", "double", "dyn"):
            raise CompileError(f"found no matching overload for '-_' applied to '{o.type.kind}'")
        return _Info(o.type, _add(1, o.cost))

    def _binary(self, n: Node, scope: dict) -> _Info:
        left, right = (self.visit(e, scope) for e in n.args)
        args = _add(left.cost, right.cost)
        lk, rk = left.type.kind, right.type.kind
        if n.op == "in":
            if rk == "list" and _compatible(left.type, right.type.elem):
                return _Info(BOOL, _add(self.size(right), args))
            if rk == "map" and _compatible(left.type, right.type.key):
                return _Info(BOOL, _add(1, args))
            raise CompileError(f"found no matching overload for '@in' applied to '({lk}, {rk})'")
        if n.op in ("==", "!="):
            if not _compatible(left.type, right.type):
                raise CompileError(f"found no matching overload for '_{n.op}_' applied to "
                                   f"'({lk}, {rk})'")
            smallest = min(self.size(left), self.size(right))
            return _Info(BOOL, _add(_factor(smallest, STRING_FACTOR), args))
        if n.op in ("<", "<=", ">", ">="):
            if not _orderable(lk, rk):
                raise CompileError(f"found no matching overload for '_{n.op}_' applied to "
                                   f"'({lk}, {rk})'")
            if {lk, rk} <= {"string", "bytes", "dyn"}:
                smallest = min(self.size(left), self.size(right))
                return _Info(BOOL, _add(_factor(smallest, STRING_FACTOR), args))
            return _Info(BOOL, _add(1, args))
        return self._arithmetic(n.op, left, right, args)

    def _arithmetic(self, op: str, left: _Info, right: _Info, args: int) -> _Info:
        lk, rk = left.type.kind, right.type.kind
        if {lk, rk} & {"dyn", "timestamp", "duration"}:
            raise Unsupported(f"'{op}' on {lk} and {rk}")
        if op == "+" and lk == rk and lk in ("string", "bytes"):
            size = _add(self.size(left), self.size(right))
            return _Info(left.type, _add(_factor(size, STRING_FACTOR), args), size=size)
        if op == "+" and lk == rk == "list":
            size = _add(self.size(left), self.size(right))
            return _Info(left.type, _add(1, args), size=size)
        numeric = lk == rk and lk in ("int", "uint", "double")
        if not numeric or (op == "%" and lk == "double"):
            raise CompileError(f"found no matching overload for '_{op}_' applied to "
                               f"'({lk}, {rk})'")
        return _Info(left.type, _add(1, args))

    def _call(self, n: Node, scope: dict) -> _Info:
        fn, member = n.value
        args = [self.visit(a, scope) for a in n.args]
        if fn == "size" and len(args) == 1:
            if args[0].type.kind not in ("string", "bytes", "list", "map", "dyn"):
                raise CompileError(f"found no matching overload for 'size' applied to "
                                   f"'{args[0].type.kind}'")
            return _Info(INT, _add(1, args[0].cost))
        if not member:
            raise Unsupported(f"global function {fn}()")
        target, rest = args[0], args[1:]
        if target.type.kind not in ("string", "dyn"):
            raise CompileError(f"found no matching overload for '{fn}' applied to "
                               f"'{target.type.kind}'")
        cost = _add(target.cost, *(a.cost for a in rest))
        if fn in ("lowerAscii", "upperAscii", "trim") and not rest:
            size = self.size(target)
            return _Info(STRING, _add(cost, _factor(size, STRING_FACTOR)), size=size)
        if len(rest) != 1 or rest[0].type.kind not in ("string", "dyn"):
            raise Unsupported(f"{fn}() with these arguments")
        arg = rest[0]
        if fn == "matches":
            _check_regex_literal(n.args[1])
            text = _factor(_add(self.size(target), 1), STRING_FACTOR)
            return _Info(BOOL, _add(cost, _mul(text, _factor(self.size(arg), REGEX_FACTOR))))
        if fn in ("startsWith", "endsWith"):
            return _Info(BOOL, _add(cost, _factor(self.size(arg), STRING_FACTOR)))
        if fn == "contains":
            text = _factor(self.size(target), STRING_FACTOR)
            return _Info(BOOL, _add(cost, _mul(text, _factor(self.size(arg), STRING_FACTOR))))
        raise Unsupported(f"function {fn}()")

    def _comp(self, n: Node, scope: dict) -> _Info:
        macro, var = n.value
        rng = self.visit(n.args[0], scope)
        if rng.type.kind == "list":
            decl, step = rng.type.elem, "@items"
        elif rng.type.kind == "map":
            decl, step = rng.type.key, "@keys"
        elif rng.type.kind == "dyn":
            raise Unsupported(f"{macro}() over an int-or-string value")
        else:
            raise CompileError(f"expression of type '{rng.type.kind}' cannot be range of a "
                               f"comprehension")
        if not rng.path:
            raise Unsupported(f"{macro}() over a computed list or map")
        body = self.visit(n.args[1], {**scope, var: (decl, rng.path + (step,))})
        if macro != "map":
            _want(body, "bool", macro)
        count = self.size(rng)
        # Per element: the macro's loop condition plus its step (parser/macro.go expansions).
        per_element = {"all": 2 + 1 + body.cost, "exists": 3 + 1 + body.cost,
                       "exists_one": body.cost + 2, "map": 12 + body.cost,
                       "filter": body.cost + 13}[macro]
        fixed = {"all": 1, "exists": 1, "exists_one": 2, "map": LIST_CREATE + 1,
                 "filter": LIST_CREATE + 1}[macro]
        cost = _add(rng.cost, fixed, _mul(count, per_element))
        if macro == "map":
            return _Info(Decl("list", elem=body.type), cost, size=count)
        if macro == "filter":
            return _Info(Decl("list", elem=decl), cost, size=count)
        return _Info(BOOL, cost, size=1)


def _want(info: _Info, kind: str, op: str) -> None:
    if info.type.kind not in (kind, "dyn"):
        raise CompileError(f"found no matching overload for '{op}' applied to "
                           f"'{info.type.kind}'")


def _compatible(a: Decl, b: Decl) -> bool:
    numeric = {"int", "uint", "double"}
    kinds = {a.kind, b.kind}
    return (len(kinds) == 1 or "dyn" in kinds or kinds <= numeric
            or ("null" in kinds and bool(kinds & {"object", "map", "list"})))


def _orderable(a: str, b: str) -> bool:
    numeric = {"int", "uint", "double"}
    if "dyn" in (a, b):
        return True
    return {a, b} <= numeric or (a == b and a in ("string", "bytes", "bool", "timestamp",
                                                  "duration"))


def _same(items: list[_Info], what: str) -> None:
    kinds = {i.type.kind for i in items} - {"dyn"}
    if len(kinds) > 1:
        raise CompileError(f"expected type of {what} elements to be the same, got "
                           f"{sorted(kinds)}")


def _check_regex_literal(n: Node) -> None:
    if n.op == "lit" and n.value[0] == "string":
        problem = _regex_problem(n.value[1])
        if problem:
            raise CompileError(f"invalid matches argument: {problem}")


def _regex_problem(pattern: str) -> str | None:
    """Whether RE2 (Go's regexp) would reject the pattern, approximated with Python's re."""
    if re.search(r"\(\?[=!<>]|\\[1-9]", pattern):
        return "lookaround and backreferences are not RE2 syntax"
    if re.search(r"\\[pP]", pattern):
        return None
    try:
        re.compile(pattern)
    except re.error as err:
        return str(err)
    return None


# --- evaluating rules on a value (cel/validation.go, CEL's error semantics) ------------------

class _Err:
    def __init__(self, message: str):
        self.message = message


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    for v in (a, b):
        if isinstance(v, _Err):
            return v
        if not _is_bool(v):
            return _Err("no such overload")
    return True


def _or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    for v in (a, b):
        if isinstance(v, _Err):
            return v
        if not _is_bool(v):
            return _Err("no such overload")
    return False


def _equals(a: Any, b: Any) -> bool:
    if _is_num(a) and _is_num(b):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_equals, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equals(a[k], b[k]) for k in a)
    return a == b


def _int64(v: int) -> Any:
    return v if -2**63 <= v < 2**63 else _Err("integer overflow")


class _Evaluator:
    def run(self, n: Node, env: dict) -> Any:
        return getattr(self, "_" + _EVAL.get(n.op, "binary"))(n, env)

    def _lit(self, n: Node, env: dict) -> Any:
        return n.value[1]

    def _ident(self, n: Node, env: dict) -> Any:
        return env[n.value]

    def _select(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, _Err):
            return o
        if not isinstance(o, dict):
            return _Err("no such overload")
        name = _unescape(n.value)
        return o[name] if name in o else _Err(f"no such key: {n.value}")

    def _has(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, _Err):
            return o
        return _unescape(n.value) in o if isinstance(o, dict) else _Err("no such overload")

    def _index(self, n: Node, env: dict) -> Any:
        a, i = self.run(n.args[0], env), self.run(n.args[1], env)
        for v in (a, i):
            if isinstance(v, _Err):
                return v
        if isinstance(a, list) and _is_num(i) and int(i) == i:
            return a[int(i)] if 0 <= i < len(a) else _Err(f"index out of bounds: {i}")
        if isinstance(a, dict):
            return a[i] if i in a else _Err(f"no such key: {i}")
        return _Err("no such overload")

    def _list(self, n: Node, env: dict) -> Any:
        items = [self.run(e, env) for e in n.args]
        return next((v for v in items if isinstance(v, _Err)), items)

    def _map(self, n: Node, env: dict) -> Any:
        parts = [self.run(e, env) for e in n.args]
        return next((v for v in parts if isinstance(v, _Err)), dict(zip(parts[::2], parts[1::2],
                                                                          strict=True)))

    def _cond(self, n: Node, env: dict) -> Any:
        c = self.run(n.args[0], env)
        if isinstance(c, _Err):
            return c
        if not _is_bool(c):
            return _Err("no such overload")
        return self.run(n.args[1] if c else n.args[2], env)

    def _logic(self, n: Node, env: dict) -> Any:
        a, b = self.run(n.args[0], env), self.run(n.args[1], env)
        return _and(a, b) if n.op == "&&" else _or(a, b)

    def _not(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, _Err):
            return o
        return (not o) if _is_bool(o) else _Err("no such overload")

    def _neg(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, _Err):
            return o
        if isinstance(o, int) and not _is_bool(o):
            return _int64(-o)
        return -o if isinstance(o, float) else _Err("no such overload")

    def _binary(self, n: Node, env: dict) -> Any:
        a, b = self.run(n.args[0], env), self.run(n.args[1], env)
        for v in (a, b):
            if isinstance(v, _Err):
                return v
        return _apply(n.op, a, b)

    def _call(self, n: Node, env: dict) -> Any:
        fn, _ = n.value
        args = [self.run(a, env) for a in n.args]
        if err := next((v for v in args if isinstance(v, _Err)), None):
            return err
        target = args[0]
        if fn == "size":
            return len(target) if isinstance(target, str | bytes | list | dict) else _Err(
                "no such overload")
        if not isinstance(target, str) or not all(isinstance(a, str) for a in args[1:]):
            return _Err("no such overload")
        if fn == "matches":
            problem = _regex_problem(args[1])
            return _Err(problem) if problem else re.search(args[1], target) is not None
        simple = {"startsWith": lambda: target.startswith(args[1]),
                  "endsWith": lambda: target.endswith(args[1]),
                  "contains": lambda: args[1] in target,
                  "lowerAscii": lambda: target.translate(_LOWER),
                  "upperAscii": lambda: target.translate(_UPPER),
                  "trim": lambda: target.strip()}
        return simple[fn]()

    def _comp(self, n: Node, env: dict) -> Any:
        macro, var = n.value
        rng = self.run(n.args[0], env)
        if isinstance(rng, _Err):
            return rng
        elements = list(rng)
        if macro in ("all", "exists"):
            acc: Any = macro == "all"
            for x in elements:
                r = self.run(n.args[1], {**env, var: x})
                acc = _and(acc, r) if macro == "all" else _or(acc, r)
                if acc is (macro == "exists"):
                    break
            return acc
        results = [self.run(n.args[1], {**env, var: x}) for x in elements]
        if err := next((r for r in results if isinstance(r, _Err)), None):
            return err
        if macro == "map":
            return results
        if not all(map(_is_bool, results)):
            return _Err("no such overload")
        if macro == "filter":
            return [x for x, keep in zip(elements, results, strict=True) if keep]
        return sum(results) == 1


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _apply(op: str, a: Any, b: Any) -> Any:
    if op == "==":
        return _equals(a, b)
    if op == "!=":
        return not _equals(a, b)
    if op == "in":
        if isinstance(b, list):
            return any(_equals(a, x) for x in b)
        return a in b if isinstance(b, dict) else _Err("no such overload")
    if op in ("<", "<=", ">", ">="):
        same = type(a) is type(b) and isinstance(a, str | bytes | bool)
        if not (same or _is_num(a) and _is_num(b)):
            return _Err("no such overload")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "+" and type(a) is type(b) and isinstance(a, str | bytes | list):
        return a + b
    if not (_is_num(a) and _is_num(b) and type(a) is type(b)):
        return _Err("no such overload")
    if isinstance(a, float):
        if op == "/":
            return a / b if b else math.copysign(math.inf, a) if a else math.nan
        return {"+": a + b, "-": a - b, "*": a * b}.get(op, _Err("no such overload"))
    if op in ("/", "%") and b == 0:
        return _Err("division by zero" if op == "/" else "modulus by zero")
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) if b else 0
    return _int64({"+": a + b, "-": a - b, "*": a * b, "/": quotient,
                   "%": a - b * quotient}[op])


def _to_cel(value: Any, s: dict) -> Any:
    """The value as CEL sees it under this schema (numbers become doubles)."""
    if value is None:
        return None
    if s.get("type") == "number" and _is_num(value):
        return float(value)
    if isinstance(value, list):
        items = s.get("items") if isinstance(s.get("items"), dict) else {}
        return [_to_cel(v, items) for v in value]
    if isinstance(value, dict):
        props, extra = s.get("properties", {}), s.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else {}
        return {k: _to_cel(v, props.get(k, extra)) for k, v in value.items()}
    return value


def _rule_failures(s: dict, value: Any, where: str, root: bool, old: bool) -> list[str]:
    """The rules of this node and of the nested nodes present in `value` that reject it, as
    the server's CEL validator walks them (transition rules only where an old value exists)."""
    decl = decl_of(s, root)
    if value is None or decl is None:
        return []
    failures = []
    cel_value = _to_cel(value, s)
    for rule in s.get(RULES, []):
        try:
            compiled = compile_rule(rule.get("rule", ""), decl)
        except (CompileError, Unsupported):
            continue  # rule_problems reports it
        if compiled.uses_old_self and not old:
            continue
        result = _Evaluator().run(compiled.ast, {"self": cel_value, "oldSelf": cel_value})
        text = json.dumps(rule["rule"])
        if isinstance(result, _Err):
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


# --- defaults (defaulting/validation.go) -------------------------------------------------------

def default_problems(schema: dict, path: str = "openAPIV3Schema") -> list[str]:
    """Every default the server rejects at CRD creation: unknown fields, an OpenAPI violation
    of its own node's schema, or (only when those pass) a CEL rule of its node or of a nested
    node present in it that errors or is false on the default exactly as written."""
    problems = []
    for node in _walk(schema, path):
        if "default" not in node.schema or node.meta or node.under_extra:
            continue
        where, value, s = f"{node.path}.default", node.schema["default"], node.schema
        if _pruned(copy.deepcopy(value), s) != value:
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


# --- walking a schema --------------------------------------------------------------------------

@dataclass
class _Node:
    schema: dict
    path: str
    cardinality: int | None = 1
    root: bool = True
    meta: str | None = None  # "top-level metadata" etc. where defaults are forbidden
    under_extra: bool = False
    uncorrelated: str | None = None  # where oldSelf stops meaning anything
    level: str = "root"


def _walk(s: dict, path: str) -> Iterator[_Node]:
    yield from _nodes(_Node(s, path))


def _nodes(node: _Node) -> Iterator[_Node]:
    yield node
    s = node.schema
    for name, prop in (s.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        meta = node.meta
        if node.level == "root" and name in ("metadata", "apiVersion", "kind"):
            meta = f"in top-level {name}"
        yield from _nodes(_Node(
            prop, f"{node.path}.properties[{name}]", node.cardinality,
            bool(prop.get(EMBEDDED)), meta, node.under_extra,
            node.uncorrelated or (node.path if s.get("x-kubernetes-map-type") == "atomic"
                                  else None), "field"))
    items = s.get("items")
    if isinstance(items, dict):
        keyed = s.get("x-kubernetes-list-type") == "map"
        yield from _nodes(_Node(
            items, f"{node.path}.items", _times(node.cardinality, s.get("maxItems")),
            bool(items.get(EMBEDDED)), node.meta, node.under_extra,
            node.uncorrelated or (None if keyed else node.path), "item"))
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _nodes(_Node(
            extra, f"{node.path}.additionalProperties",
            _times(node.cardinality, s.get("maxProperties")), bool(extra.get(EMBEDDED)),
            node.meta, True, node.uncorrelated, "field"))


def _times(cardinality: int | None, bound: int | None) -> int | None:
    if cardinality is None or bound is None:
        return None
    return _mul(cardinality, max(bound, 0))


# --- CEL rules: compilation and cost (validation.go, compilation.go) --------------------------

@dataclass
class RuleCost:
    """One rule's static cost: `cost` is the compiler's estimate for one evaluation,
    `cardinality` how many times it can run in one object, `total` their product."""

    path: str
    rule: str
    cost: int
    cardinality: int
    total: int


def rule_problems(schema: dict, path: str = "openAPIV3Schema") -> list[str]:
    """Rules the server refuses to compile against their node's type (an undeclared field,
    a wrong operand type, a non-bool result, oldSelf where values cannot be correlated), plus
    the text checks on rule, message, reason and fieldPath."""
    problems = []
    for node in _walk(schema, path):
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


def rule_costs(schema: dict, path: str = "openAPIV3Schema") -> list[RuleCost | str]:
    """The static cost of every rule that compiles; a rule outside the modelled subset of CEL
    appears as a message instead of a cost."""
    costs: list[RuleCost | str] = []
    for node in _walk(schema, path):
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
            total = 0 if compiled.cost == 0 else _mul(compiled.cost, times)
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
        total = _add(total, c.total)
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


# --- structural schema and keyword checks (schema/validation.go, validation.go) --------------

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
    for node in _walk(schema, path):
        problems += _node_problems(node)
    return problems


def _node_problems(node: _Node) -> list[str]:
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
    if "pattern" in s and (why := _regex_problem(s["pattern"])):
        problems.append(f"{p}.pattern: Invalid value: {json.dumps(s['pattern'])}: must be a "
                        f"valid regular expression, but isn't: {why}")
    for key in ("allOf", "anyOf", "oneOf", "not"):
        for i, sub in enumerate(s[key] if isinstance(s.get(key), list) else [s.get(key)]):
            if isinstance(sub, dict):
                where = f"{p}.{key}" + (f"[{i}]" if key != "not" else "")
                problems += _nested_value_problems(sub, where, _int_or_string_pattern(s, key, i))
    return problems


def _type_problems(node: _Node) -> list[str]:
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


# --- the whole CRD ----------------------------------------------------------------------------

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
