"""CEL rule text as a small AST built from celpy's parse tree. What the server's parser rejects
raises CompileError; a construct outside the modelled subset raises Unsupported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy


@dataclass(frozen=True)
class Node:
    """One expression: `op` an operator or one of NAMED, `value` what the op needs
    besides its operands (a literal, a field name, a function or macro)."""

    op: str
    args: tuple = ()
    value: Any = None


# The ops that are not operators: a visitor handles each in the method of the same name.
NAMED = ("lit", "ident", "select", "has", "index", "list", "map", "call", "comp")


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
    """The AST of a rule's text."""
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
