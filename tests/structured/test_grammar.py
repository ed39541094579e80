"""Constraints compiled from request fields: every kind compiles, bad input is a ConstraintError that
names the field, before any tokenizer or model is involved."""

import pytest

from speclm.structured.grammar import ConstraintError, compile_constraint, constraint_from_response_format

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
}


@pytest.mark.parametrize(
    "kind, value",
    [
        ("json_object", None),
        ("json_schema", SCHEMA),
        ("json_schema", True),
        ("regex", r"\d{3}-[a-z]+"),
        ("choice", ["yes", "no", "maybe"]),
        ("grammar", 'start: "a"+ "b"'),
        ("grammar", 'root ::= "a" [0-9]+'),  # GBNF
    ],
)
def test_each_kind_compiles(kind, value):
    constraint = compile_constraint(kind, value, "field")
    assert constraint.kind == kind and constraint.grammar


@pytest.mark.parametrize(
    "kind, value, words",
    [
        ("json_schema", {"type": "foo"}, "Invalid type: foo"),
        ("json_schema", {"type": "string", "format": "weird"}, "Unknown format"),
        ("json_schema", {"$ref": "#/defs/x"}, "does not exist"),
        ("json_schema", "not a schema", "must be an object"),
        ("regex", "a(b", "unclosed group"),
        ("regex", "", "non-empty string"),
        ("choice", [], "non-empty list"),
        ("choice", ["a", 3], "non-empty list"),
        ("grammar", "start: undefined_rule", "unknown name"),
        ("grammar", "   ", "non-empty string"),
        ("xml", "<a/>", "unsupported constraint type"),
    ],
)
def test_bad_constraints_name_the_field(kind, value, words):
    with pytest.raises(ConstraintError) as info:
        compile_constraint(kind, value, "response_format.json_schema.schema")
    assert info.value.param == "response_format.json_schema.schema"
    assert words in info.value.message
    assert isinstance(info.value, ValueError)


def test_response_format():
    assert constraint_from_response_format(None) is None
    assert constraint_from_response_format({"type": "text"}) is None
    assert constraint_from_response_format({"type": "json_object"}).kind == "json_object"
    rf = {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA, "strict": True}}
    assert constraint_from_response_format(rf).kind == "json_schema"
    for bad, param in [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": 3}}}, "response_format.json_schema.schema"),
        ("json", "response_format"),
    ]:
        with pytest.raises(ConstraintError) as info:
            constraint_from_response_format(bad)
        assert info.value.param == param
