"""What a constrained request asks for: a JSON schema, any JSON object, a regex, a choice of
strings, or a grammar. Pure Python: validated here, compiled by the engine (backend.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tokenmill.engine.core.structured.schema import regex_unsupported, unsupported_features


class StructuredOutputsError(ValueError):
    """An invalid or unsupported constraint; the message names the feature."""


@dataclass(frozen=True, eq=False)
class StructuredOutputsParams:
    """Exactly one of the constraints (vLLM's `structured_outputs` names).

    json: a JSON Schema (a dict, or its JSON text); the output is one JSON value that validates
        against it. Objects are closed unless the schema sets additionalProperties.
    json_object: any JSON object (OpenAI's response_format {"type": "json_object"}).
    regex: the whole output matches it.
    choice: the output is exactly one of these strings.
    grammar: an EBNF grammar (xgrammar / GBNF syntax, start rule `root`).
    structural_tag: vLLM's structural tag (a dict, or its JSON text): free text in which each
        trigger opens a tagged segment held to its schema (`structures` and `triggers`), or
        xgrammar's `format` of tags the whole output follows.

    A schema feature the grammar can't enforce raises StructuredOutputsError naming it.
    Equal constraints compile once: `key` identifies a constraint in the engine's cache.
    """

    json: dict[str, Any] | bool | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    key: tuple[str, str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        given = [name for name, on in (("json", self.json is not None),
                                       ("json_object", self.json_object),
                                       ("regex", self.regex is not None),
                                       ("choice", self.choice is not None),
                                       ("grammar", self.grammar is not None),
                                       ("structural_tag", self.structural_tag is not None))
                 if on]
        if len(given) != 1:
            raise StructuredOutputsError(
                "exactly one of json, json_object, regex, choice, grammar, structural_tag "
                f"must be given, got {', '.join(given) or 'none'}")
        kind = given[0]
        if kind == "json":
            schema = _parse_schema(self.json)
            problems = unsupported_features(schema)
            if problems:
                raise StructuredOutputsError(
                    f"unsupported JSON Schema features: {'; '.join(problems)}")
            text = json.dumps(schema)  # property order is the output order: keep it
        elif kind == "json_object":
            text = ""
        elif kind == "regex":
            if not isinstance(self.regex, str) or not self.regex:
                raise StructuredOutputsError("regex must be a non-empty string")
            problems = regex_unsupported(self.regex)
            if problems:
                raise StructuredOutputsError(f"unsupported regex features: {problems[0]}")
            text = self.regex
        elif kind == "choice":
            choices = self.choice
            if (isinstance(choices, str) or not choices
                    or not all(isinstance(c, str) and c for c in choices)):
                raise StructuredOutputsError("choice must be a non-empty list of non-empty "
                                             "strings")
            object.__setattr__(self, "choice", tuple(choices))
            text = json.dumps(list(self.choice))
        elif kind == "structural_tag":
            text = json.dumps(_structural_tag(self.structural_tag))
        else:
            if not isinstance(self.grammar, str) or not self.grammar.strip():
                raise StructuredOutputsError("grammar must be a non-empty string")
            text = self.grammar
        object.__setattr__(self, "key", (kind, text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StructuredOutputsParams) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def kind(self) -> str:
        return self.key[0]

    def schema(self) -> dict[str, Any] | bool | None:
        """The JSON schema of a `json` constraint, parsed."""
        return json.loads(self.key[1]) if self.kind == "json" else None


def _parse_schema(value: Any) -> dict[str, Any] | bool:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise StructuredOutputsError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(value, dict | bool):
        raise StructuredOutputsError(
            f"a JSON schema must be an object or a boolean, got {type(value).__name__}")
    return value


def _structural_tag(value: Any) -> dict[str, Any]:
    """A structural tag as a dict: vLLM's `structures` (each {begin, schema, end}) with
    `triggers`, or xgrammar's `format`; each schema held to what the grammar enforces."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise StructuredOutputsError(f"the structural tag is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or ("structures" not in value and "format" not in value):
        raise StructuredOutputsError("a structural tag is an object with structures and "
                                     "triggers, or with a format")
    if "structures" in value:
        structures, triggers = value.get("structures"), value.get("triggers")
        if (not isinstance(structures, list) or not structures or not isinstance(triggers, list)
                or not all(isinstance(t, str) and t for t in triggers)):
            raise StructuredOutputsError("a structural tag's structures must be a non-empty "
                                         "list and its triggers a list of non-empty strings")
        for i, item in enumerate(structures):
            if not isinstance(item, dict) or not all(
                    isinstance(item.get(k), str) for k in ("begin", "end")):
                raise StructuredOutputsError(f"structures[{i}] needs begin and end strings")
            problems = unsupported_features(_parse_schema(item.get("schema", True)))
            if problems:
                raise StructuredOutputsError(f"structures[{i}]: unsupported JSON Schema "
                                             f"features: {'; '.join(problems)}")
    return value
