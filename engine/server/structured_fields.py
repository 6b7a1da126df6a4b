"""The request fields that constrain a reply: OpenAI's response_format, vLLM's structured_outputs
and its older guided_json / guided_regex / guided_choice / guided_grammar. At most one may be
given; each becomes the engine's StructuredOutputsParams, and an error names the field used."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenmill.engine.core import StructuredOutputsParams
from tokenmill.engine.core.errors import SamplingParamsError, StructuredOutputsError

CONSTRAINT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar", "structural_tag")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


class JSONSchemaFormat(_Strict):
    """response_format.json_schema: {"name", "schema", "strict", "description"}."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's types, and vLLM's structural_tag (its structures and triggers, or
    xgrammar's format)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JSONSchemaFormat | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None


class StructuredOutputsField(_Strict):
    """vLLM's structured_outputs: exactly one of json, json_object, regex, choice, grammar."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        known = {"json", "json_object", "regex", "choice", "grammar", "structural_tag"}
        unknown = sorted(set(value) - known) if isinstance(value, dict) else []
        if unknown:
            raise ValueError(f"structured_outputs: {', '.join(unknown)} is not supported; it "
                             "takes one of json, json_object, regex, choice, grammar, "
                             "structural_tag")
        return value


class StructuredFields(BaseModel):
    """Mixed into the sampling fields of both endpoints: the constraint fields, and OpenAI's
    logit_bias ({"token id": bias in [-100, 100]}, checked by SamplingParams and the engine)."""

    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None  # vLLM's (JSON text or an object)

    def constraint_field(self) -> str | None:
        """The one constraining field given (a text response_format constrains nothing)."""
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None
                 and not (name == "response_format" and self.response_format.type == "text")]
        if len(given) > 1:
            raise SamplingParamsError(f"{given[1]}: only one of {', '.join(given)} may be given")
        return given[0] if given else None

    def constraint(self) -> StructuredOutputsParams | None:
        """The engine's constraint; SamplingParamsError, prefixed with the field, if it is
        invalid or uses a feature the grammar can't enforce."""
        name = self.constraint_field()
        if name is None:
            return None
        try:
            return StructuredOutputsParams(**self._constraint_args(name))
        except StructuredOutputsError as exc:
            raise SamplingParamsError(f"{name}: {exc}") from None

    def _constraint_args(self, name: str) -> dict[str, Any]:
        if name == "response_format":
            fmt = self.response_format
            if fmt.type == "json_object":
                return {"json_object": True}
            if fmt.type == "structural_tag":
                return {"structural_tag": fmt.model_dump(exclude_none=True)}
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise SamplingParamsError("response_format: a json_schema response_format needs "
                                          "json_schema.schema")
            return {"json": fmt.json_schema.schema_}
        if name == "structured_outputs":
            so = self.structured_outputs
            args = {"json": so.json_, "json_object": bool(so.json_object), "regex": so.regex,
                    "choice": so.choice, "grammar": so.grammar,
                    "structural_tag": so.structural_tag}
            return {k: v for k, v in args.items() if v is not None and v is not False}
        key = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
               "guided_grammar": "grammar", "structural_tag": "structural_tag"}[name]
        return {key: getattr(self, name)}
