"""Constraints compiled from what a request asks for (a JSON schema, a regex, a choice, a grammar) into
one llguidance grammar, checked before any model work."""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance

# Separators as json.dumps writes them and no other whitespace between JSON tokens: the model cannot
# spend its budget on newlines (a flexible-whitespace grammar lets a small model emit blank lines until
# max_tokens), and the forced skeleton is longer (more free drafts).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


class ConstraintError(ValueError):
    """A constraint a request asks for is invalid or unsupported; `param` names the request field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True)
class Constraint:
    """A validated grammar (llguidance's serialized form) and what it was built from."""

    kind: str
    grammar: str
    source: str  # the request's text of it (a schema as JSON, the regex, ...) for logs and errors

    def __str__(self) -> str:
        return f"{self.kind}({self.source[:80]})"


def compile_constraint(kind: str, value: object, param: str) -> Constraint:
    """The Constraint for `kind` (json_object, json_schema, regex, choice, grammar) and its value.

    `param` is the request field the value came from (e.g. "response_format.json_schema.schema"); a bad
    value raises ConstraintError naming it. Grammars may be Lark (llguidance's dialect) or GBNF."""
    if kind == "json_object":
        return _validated(
            kind, llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS), "", param
        )
    if kind == "json_schema":
        if isinstance(value, bool):  # true / false are JSON schemas, but `false` accepts nothing
            value = {} if value else None
        if not isinstance(value, dict):
            raise ConstraintError(param, f"a JSON schema must be an object, got {_short(value)}")
        text = json.dumps(value)
        return _validated(kind, llguidance.LLMatcher.grammar_from_json_schema(value, JSON_OPTIONS), text, param)
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise ConstraintError(param, f"a regex must be a non-empty string, got {_short(value)}")
        return _validated(kind, llguidance.LLMatcher.grammar_from_regex(value), value, param)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise ConstraintError(param, f"a choice must be a non-empty list of non-empty strings, got {_short(value)}")
        return _validated(kind, llguidance.grammar_from("choice", json.dumps(value)), json.dumps(value), param)
    if kind == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise ConstraintError(param, f"a grammar must be a non-empty string, got {_short(value)}")
        try:  # Lark as is; GBNF (`root ::= ...`) converted to Lark by llguidance
            grammar = llguidance.grammar_from("grammar", value)
        except ValueError as e:
            raise ConstraintError(param, f"invalid grammar: {e}") from e
        return _validated(kind, grammar, value, param)
    raise ConstraintError(param, f"unsupported constraint type {kind!r} (supported: {', '.join(KINDS)})")


def constraint_from_response_format(response_format: dict | None, param: str = "response_format") -> Constraint | None:
    """The Constraint of an OpenAI `response_format` (None for {"type": "text"} or no field)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ConstraintError(param, f"must be an object, got {_short(response_format)}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return compile_constraint("json_object", None, param)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise ConstraintError(f"{param}.json_schema", "is required with type json_schema (an object with `schema`)")
        if "schema" not in spec:
            raise ConstraintError(f"{param}.json_schema.schema", "is required")
        return compile_constraint("json_schema", spec["schema"], f"{param}.json_schema.schema")
    raise ConstraintError(f"{param}.type", f"must be text, json_object or json_schema, got {_short(kind)}")


def tokens_grammar(lark: str, param: str) -> Constraint:
    """A Constraint from Lark text we build ourselves (tool calls); `param` names the request field it serves."""
    return _validated("grammar", llguidance.LLMatcher.grammar_from_lark(lark), lark, param)


def _validated(kind: str, grammar: str, source: str, param: str) -> Constraint:
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ConstraintError(param, f"invalid or unsupported {kind.replace('_', ' ')}: {error.strip()}")
    return Constraint(kind, grammar, source)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
