"""A compiled rule evaluated on a value with CEL's error semantics: an error is a value, which
&& and || absorb when the other side decides (as the server's cel/validation.go runs rules)."""

from __future__ import annotations

import math
import re
from typing import Any

from .cel_syntax import NAMED, Node
from .cel_types import unescape
from .re2 import regex_problem


class Err:
    """An error as CEL carries it: a value that operators pass on and that && and ||
    absorb when their other side decides."""

    def __init__(self, message: str):
        self.message = message


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _and_or(a: Any, b: Any, decider: bool) -> Any:
    """a && b (decider False) or a || b (decider True): a side equal to the decider settles it
    whatever the other side holds, errors included; else an error, then a non-bool, wins."""
    if a is decider or b is decider:
        return decider
    for v in (a, b):
        if isinstance(v, Err):
            return v
        if not _is_bool(v):
            return Err("no such overload")
    return not decider


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
    return v if -2**63 <= v < 2**63 else Err("integer overflow")


_EVAL = {"?:": "cond", "&&": "logic", "||": "logic", "!": "not", "neg": "neg",
         **{op: op for op in NAMED}}


def evaluate(ast: Node, env: dict) -> Any:
    """The value of a compiled rule with `env` bound, or the Err CEL would report."""
    return _Evaluator().run(ast, env)


class _Evaluator:
    def run(self, n: Node, env: dict) -> Any:
        return getattr(self, "_" + _EVAL.get(n.op, "binary"))(n, env)

    def _lit(self, n: Node, env: dict) -> Any:
        return n.value[1]

    def _ident(self, n: Node, env: dict) -> Any:
        return env[n.value]

    def _select(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, Err):
            return o
        if not isinstance(o, dict):
            return Err("no such overload")
        name = unescape(n.value)
        return o[name] if name in o else Err(f"no such key: {n.value}")

    def _has(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, Err):
            return o
        return unescape(n.value) in o if isinstance(o, dict) else Err("no such overload")

    def _index(self, n: Node, env: dict) -> Any:
        a, i = self.run(n.args[0], env), self.run(n.args[1], env)
        for v in (a, i):
            if isinstance(v, Err):
                return v
        if isinstance(a, list) and _is_num(i) and int(i) == i:
            return a[int(i)] if 0 <= i < len(a) else Err(f"index out of bounds: {i}")
        if isinstance(a, dict):
            return a[i] if i in a else Err(f"no such key: {i}")
        return Err("no such overload")

    def _list(self, n: Node, env: dict) -> Any:
        items = [self.run(e, env) for e in n.args]
        return next((v for v in items if isinstance(v, Err)), items)

    def _map(self, n: Node, env: dict) -> Any:
        parts = [self.run(e, env) for e in n.args]
        return next((v for v in parts if isinstance(v, Err)), dict(zip(parts[::2], parts[1::2],
                                                                          strict=True)))

    def _cond(self, n: Node, env: dict) -> Any:
        c = self.run(n.args[0], env)
        if isinstance(c, Err):
            return c
        if not _is_bool(c):
            return Err("no such overload")
        return self.run(n.args[1] if c else n.args[2], env)

    def _logic(self, n: Node, env: dict) -> Any:
        a, b = self.run(n.args[0], env), self.run(n.args[1], env)
        return _and_or(a, b, n.op == "||")

    def _not(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, Err):
            return o
        return (not o) if _is_bool(o) else Err("no such overload")

    def _neg(self, n: Node, env: dict) -> Any:
        o = self.run(n.args[0], env)
        if isinstance(o, Err):
            return o
        if isinstance(o, int) and not _is_bool(o):
            return _int64(-o)
        return -o if isinstance(o, float) else Err("no such overload")

    def _binary(self, n: Node, env: dict) -> Any:
        a, b = self.run(n.args[0], env), self.run(n.args[1], env)
        for v in (a, b):
            if isinstance(v, Err):
                return v
        return _apply(n.op, a, b)

    def _call(self, n: Node, env: dict) -> Any:
        fn, _ = n.value
        args = [self.run(a, env) for a in n.args]
        if err := next((v for v in args if isinstance(v, Err)), None):
            return err
        target = args[0]
        if fn == "size":
            return len(target) if isinstance(target, str | bytes | list | dict) else Err(
                "no such overload")
        if not isinstance(target, str) or not all(isinstance(a, str) for a in args[1:]):
            return Err("no such overload")
        if fn == "matches":
            problem = regex_problem(args[1])
            return Err(problem) if problem else re.search(args[1], target) is not None
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
        if isinstance(rng, Err):
            return rng
        elements = list(rng)
        if macro in ("all", "exists"):
            acc: Any = macro == "all"
            for x in elements:
                r = self.run(n.args[1], {**env, var: x})
                acc = _and_or(acc, r, macro == "exists")
                if acc is (macro == "exists"):
                    break
            return acc
        results = [self.run(n.args[1], {**env, var: x}) for x in elements]
        if err := next((r for r in results if isinstance(r, Err)), None):
            return err
        if macro == "map":
            return results
        if not all(map(_is_bool, results)):
            return Err("no such overload")
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
        return a in b if isinstance(b, dict) else Err("no such overload")
    if op in ("<", "<=", ">", ">="):
        same = type(a) is type(b) and isinstance(a, str | bytes | bool)
        if not (same or _is_num(a) and _is_num(b)):
            return Err("no such overload")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "+" and type(a) is type(b) and isinstance(a, str | bytes | list):
        return a + b
    if not (_is_num(a) and _is_num(b) and type(a) is type(b)):
        return Err("no such overload")
    if isinstance(a, float):
        if op == "/":
            return a / b if b else math.copysign(math.inf, a) if a else math.nan
        return {"+": a + b, "-": a - b, "*": a * b}.get(op, Err("no such overload"))
    if op in ("/", "%") and b == 0:
        return Err("division by zero" if op == "/" else "modulus by zero")
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) if b else 0
    return _int64({"+": a + b, "-": a - b, "*": a * b, "/": quotient,
                   "%": a - b * quotient}[op])


def to_cel(value: Any, s: dict) -> Any:
    """The value as CEL sees it under this schema (numbers become doubles)."""
    if value is None:
        return None
    if s.get("type") == "number" and _is_num(value):
        return float(value)
    if isinstance(value, list):
        items = s.get("items") if isinstance(s.get("items"), dict) else {}
        return [to_cel(v, items) for v in value]
    if isinstance(value, dict):
        props, extra = s.get("properties", {}), s.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else {}
        return {k: to_cel(v, props.get(k, extra)) for k, v in value.items()}
    return value
