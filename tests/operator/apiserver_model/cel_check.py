"""The compile step: a rule type-checked against its node's CEL type, and its cost estimated in
the same pass, as cel-go's checker and checker/cost.go do.

Call costs (apiserver pkg/cel/library/cost.go, cel-go checker/cost.go and common/cost.go):
string traversal 0.1 per character, regex 0.25 per pattern character times (size + 1) of the
matched string; environment/base.go: has() costs only its operand (PresenceTestHasCost false).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cel_syntax import NAMED, CompileError, Node, Unsupported, parse
from .cel_types import BOOL, BYTES, DOUBLE, DYN, INT, NULL, SCALARS, STRING, UINT, Decl
from .re2 import regex_problem
from .saturating import U64, add, by_factor, mul

STRING_FACTOR = 0.1
REGEX_FACTOR = 0.25
LIST_CREATE = 10
MAP_CREATE = 30


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


_CHECK = {"?:": "cond", "&&": "logic", "||": "logic", "!": "unary", "neg": "unary",
          **{op: op for op in NAMED}}


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
        return _Info(decl, add(1, a.cost, i.cost), a.path + (step,) if a.path else None)

    def _list(self, n: Node, scope: dict) -> _Info:
        items = [self.visit(e, scope) for e in n.args]
        _same(items, "list")
        elem = items[0].type if items else DYN
        return _Info(Decl("list", elem=elem), add(LIST_CREATE, *(i.cost for i in items)),
                     size=len(items))

    def _map(self, n: Node, scope: dict) -> _Info:
        parts = [self.visit(e, scope) for e in n.args]
        keys, values = parts[0::2], parts[1::2]
        _same(keys, "map key")
        _same(values, "map value")
        decl = Decl("map", elem=values[0].type if values else DYN,
                    key=keys[0].type if keys else DYN)
        return _Info(decl, add(MAP_CREATE, *(p.cost for p in parts)), size=len(keys))

    def _cond(self, n: Node, scope: dict) -> _Info:
        c, t, f = (self.visit(e, scope) for e in n.args)
        _want(c, "bool", "_?_:_")
        if not _compatible(t.type, f.type):
            raise CompileError(f"found no matching overload for '_?_:_' applied to "
                               f"'(bool, {t.type.kind}, {f.type.kind})'")
        return _Info(t.type, add(c.cost, max(t.cost, f.cost)),
                     size=max(self.size(t), self.size(f)))

    def _logic(self, n: Node, scope: dict) -> _Info:
        left, right = (self.visit(e, scope) for e in n.args)
        _want(left, "bool", n.op)
        _want(right, "bool", n.op)
        return _Info(BOOL, add(left.cost, right.cost))

    def _unary(self, n: Node, scope: dict) -> _Info:
        o = self.visit(n.args[0], scope)
        if n.op == "!":
            _want(o, "bool", "!_")
            return _Info(BOOL, add(1, o.cost))
        if o.type.kind not in ("int", "double", "dyn"):
            raise CompileError(f"found no matching overload for '-_' applied to '{o.type.kind}'")
        return _Info(o.type, add(1, o.cost))

    def _binary(self, n: Node, scope: dict) -> _Info:
        left, right = (self.visit(e, scope) for e in n.args)
        args = add(left.cost, right.cost)
        lk, rk = left.type.kind, right.type.kind
        if n.op == "in":
            if rk == "list" and _compatible(left.type, right.type.elem):
                return _Info(BOOL, add(self.size(right), args))
            if rk == "map" and _compatible(left.type, right.type.key):
                return _Info(BOOL, add(1, args))
            raise CompileError(f"found no matching overload for '@in' applied to '({lk}, {rk})'")
        if n.op in ("==", "!="):
            if not _compatible(left.type, right.type):
                raise CompileError(f"found no matching overload for '_{n.op}_' applied to "
                                   f"'({lk}, {rk})'")
            smallest = min(self.size(left), self.size(right))
            return _Info(BOOL, add(by_factor(smallest, STRING_FACTOR), args))
        if n.op in ("<", "<=", ">", ">="):
            if not _orderable(lk, rk):
                raise CompileError(f"found no matching overload for '_{n.op}_' applied to "
                                   f"'({lk}, {rk})'")
            if {lk, rk} <= {"string", "bytes", "dyn"}:
                smallest = min(self.size(left), self.size(right))
                return _Info(BOOL, add(by_factor(smallest, STRING_FACTOR), args))
            return _Info(BOOL, add(1, args))
        return self._arithmetic(n.op, left, right, args)

    def _arithmetic(self, op: str, left: _Info, right: _Info, args: int) -> _Info:
        lk, rk = left.type.kind, right.type.kind
        if {lk, rk} & {"dyn", "timestamp", "duration"}:
            raise Unsupported(f"'{op}' on {lk} and {rk}")
        if op == "+" and lk == rk and lk in ("string", "bytes"):
            size = add(self.size(left), self.size(right))
            return _Info(left.type, add(by_factor(size, STRING_FACTOR), args), size=size)
        if op == "+" and lk == rk == "list":
            size = add(self.size(left), self.size(right))
            return _Info(left.type, add(1, args), size=size)
        numeric = lk == rk and lk in ("int", "uint", "double")
        if not numeric or (op == "%" and lk == "double"):
            raise CompileError(f"found no matching overload for '_{op}_' applied to "
                               f"'({lk}, {rk})'")
        return _Info(left.type, add(1, args))

    def _call(self, n: Node, scope: dict) -> _Info:
        fn, member = n.value
        args = [self.visit(a, scope) for a in n.args]
        if fn == "size" and len(args) == 1:
            if args[0].type.kind not in ("string", "bytes", "list", "map", "dyn"):
                raise CompileError(f"found no matching overload for 'size' applied to "
                                   f"'{args[0].type.kind}'")
            return _Info(INT, add(1, args[0].cost))
        if not member:
            raise Unsupported(f"global function {fn}()")
        target, rest = args[0], args[1:]
        if target.type.kind not in ("string", "dyn"):
            raise CompileError(f"found no matching overload for '{fn}' applied to "
                               f"'{target.type.kind}'")
        cost = add(target.cost, *(a.cost for a in rest))
        if fn in ("lowerAscii", "upperAscii", "trim") and not rest:
            size = self.size(target)
            return _Info(STRING, add(cost, by_factor(size, STRING_FACTOR)), size=size)
        if len(rest) != 1 or rest[0].type.kind not in ("string", "dyn"):
            raise Unsupported(f"{fn}() with these arguments")
        arg = rest[0]
        if fn == "matches":
            _check_regex_literal(n.args[1])
            text = by_factor(add(self.size(target), 1), STRING_FACTOR)
            return _Info(BOOL, add(cost, mul(text, by_factor(self.size(arg), REGEX_FACTOR))))
        if fn in ("startsWith", "endsWith"):
            return _Info(BOOL, add(cost, by_factor(self.size(arg), STRING_FACTOR)))
        if fn == "contains":
            text = by_factor(self.size(target), STRING_FACTOR)
            return _Info(BOOL, add(cost, mul(text, by_factor(self.size(arg), STRING_FACTOR))))
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
        cost = add(rng.cost, fixed, mul(count, per_element))
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
        problem = regex_problem(n.value[1])
        if problem:
            raise CompileError(f"invalid matches argument: {problem}")
