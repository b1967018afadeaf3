"""``turnwire_server.providers.json_schema``: the structured-output validator on its own.

Each keyword it covers, with the problem text it gives (a JSON pointer to the
offending value, then what is wrong), ``$ref``, combinators, and the limit.
"""

from __future__ import annotations

from typing import Any

import pytest

from turnwire_server.providers.json_schema import validate

# --------------------------------------------------------------------------- type


@pytest.mark.parametrize(
    ("value", "type_", "ok"),
    [
        ({}, "object", True),
        ([], "object", False),
        ([], "array", True),
        ("x", "string", True),
        (True, "boolean", True),
        (0, "boolean", False),
        (None, "null", True),
        (0, "null", False),
        (3, "integer", True),
        (3.0, "integer", True),  # a float with no fraction is an integer, as JSON says
        (3.5, "integer", False),
        (True, "integer", False),  # booleans are not numbers
        (3, "number", True),
        (3.5, "number", True),
        (False, "number", False),
        ("3", "number", False),
        ({}, "no-such-type", False),
    ],
)
def test_type(value: Any, type_: str, ok: bool) -> None:
    problems = validate(value, {"type": type_})
    if ok:
        assert problems == []
    else:
        assert problems == [f"/: expected {type_}, got {type(value).__name__}"]


def test_a_list_of_types_accepts_any_of_them() -> None:
    schema = {"type": ["integer", "null"]}
    assert validate(None, schema) == []
    assert validate(4, schema) == []
    assert validate("4", schema) == ["/: expected integer or null, got str"]


def test_a_wrong_type_stops_the_other_checks_of_that_schema() -> None:
    schema = {"type": "string", "minLength": 3, "enum": ["abc"]}
    assert validate(7, schema) == ["/: expected string, got int"]


# --------------------------------------------------------------------------- enum, const


def test_enum_and_const() -> None:
    assert validate("b", {"enum": ["a", "b"]}) == []
    assert validate("c", {"enum": ["a", "b"]}) == ["/: 'c' is not one of ['a', 'b']"]
    assert validate({"k": [1]}, {"const": {"k": [1]}}) == []
    assert validate(2, {"const": 3}) == ["/: expected 3"]
    assert validate(1.0, {"const": 1}) == []  # equal numbers, as in JSON Schema


@pytest.mark.xfail(
    strict=True,
    reason="enum/const compare with Python ==, where True == 1 and False == 0; JSON Schema keeps "
    "booleans and numbers apart",
)
def test_enum_and_const_keep_booleans_and_numbers_apart() -> None:
    assert validate(True, {"enum": [1, 2]}) != []
    assert validate(0, {"const": False}) != []


# --------------------------------------------------------------------------- objects


def test_required_properties() -> None:
    schema = {"type": "object", "required": ["a", "b"]}
    assert validate({"a": 1, "b": None}, schema) == []
    assert validate({}, schema) == [
        "/: missing required property 'a'",
        "/: missing required property 'b'",
    ]


def test_properties_are_checked_at_their_pointer() -> None:
    schema = {
        "type": "object",
        "properties": {"inner": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    }
    assert validate({"inner": {"n": 1}}, schema) == []
    assert validate({"inner": {"n": "1"}}, schema) == ["/inner/n: expected integer, got str"]
    assert validate({"inner": {"n": 1}, "extra": "anything"}, schema) == []  # allowed by default


def test_additional_properties_false_refuses_unknown_names() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert validate({"a": 1}, schema) == []
    assert validate({"a": 1, "b": 2, "c": 3}, schema) == [
        "/b: property is not allowed",
        "/c: property is not allowed",
    ]


def test_additional_properties_schema_checks_unknown_names() -> None:
    schema = {"properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}}
    assert validate({"a": "x", "b": 2}, schema) == []
    assert validate({"a": "x", "b": "2"}, schema) == ["/b: expected integer, got str"]


def test_a_false_property_schema_refuses_any_value() -> None:
    assert validate({"a": 1}, {"properties": {"a": False}}) == ["/a: no value is allowed here"]
    assert validate({}, {"properties": {"a": False}}) == []


@pytest.mark.xfail(
    strict=True,
    reason="property names go into the pointer unescaped; RFC 6901 writes '/' as '~1' and '~' as '~0'",
)
def test_pointers_escape_slash_and_tilde_in_property_names() -> None:
    schema = {"properties": {"a/b": {"type": "string"}, "c~d": {"type": "string"}}}
    problems = validate({"a/b": 1, "c~d": 2}, schema)
    assert [problem.split(": ")[0] for problem in problems] == ["/a~1b", "/c~0d"]


# --------------------------------------------------------------------------- arrays


def test_items_apply_to_every_element() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    assert validate(["a", "b"], schema) == []
    assert validate(["a", 2, "c", None], schema) == [
        "/1: expected string, got int",
        "/3: expected string, got NoneType",
    ]


def test_prefix_items_then_items_for_the_rest() -> None:
    schema = {"prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": {"type": "integer"}}
    assert validate(["a", True, 1, 2], schema) == []
    assert validate(["a"], schema) == []  # shorter than the prefix is fine
    assert validate([1, True, "x"], schema) == [
        "/0: expected string, got int",
        "/2: expected integer, got str",
    ]


def test_min_and_max_items() -> None:
    assert validate([1], {"minItems": 1, "maxItems": 2}) == []
    assert validate([], {"minItems": 1}) == ["/: fewer than 1 items"]
    assert validate([1, 2, 3], {"maxItems": 2}) == ["/: more than 2 items"]


def test_pointers_nest_through_arrays_and_objects() -> None:
    schema = {"items": {"properties": {"tags": {"items": {"type": "string"}}}}}
    assert validate([{"tags": ["a"]}, {"tags": ["b", 3]}], schema) == ["/1/tags/1: expected string, got int"]


# --------------------------------------------------------------------------- strings and numbers


def test_string_length_and_pattern() -> None:
    schema = {"minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"}
    assert validate("abc", schema) == []
    assert validate("a", schema) == ["/: shorter than 2"]
    assert validate("abcde", schema) == ["/: longer than 4"]
    assert validate("AB", schema) == ["/: does not match '^[a-z]+$'"]


def test_a_pattern_matches_anywhere_unless_anchored() -> None:
    assert validate("xx42yy", {"pattern": "[0-9]+"}) == []


def test_string_keywords_do_not_apply_to_other_types() -> None:
    assert validate(5, {"minLength": 10, "pattern": "^x$"}) == []
    assert validate("x", {"minimum": 10}) == []


def test_minimum_and_maximum_are_inclusive() -> None:
    schema = {"minimum": 1, "maximum": 3}
    assert [validate(n, schema) for n in (1, 2, 3, 2.5)] == [[], [], [], []]
    assert validate(0, schema) == ["/: below the minimum 1"]
    assert validate(3.5, schema) == ["/: above the maximum 3"]


def test_exclusive_minimum_and_maximum() -> None:
    schema = {"exclusiveMinimum": 1, "exclusiveMaximum": 3}
    assert validate(2, schema) == []
    assert validate(1, schema) == ["/: not above 1"]
    assert validate(3, schema) == ["/: not below 3"]


def test_number_keywords_do_not_apply_to_booleans() -> None:
    assert validate(True, {"minimum": 5}) == []


# --------------------------------------------------------------------------- combinators


def test_any_of() -> None:
    schema = {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 10}]}
    assert validate("x", schema) == []
    assert validate(11, schema) == []
    assert validate(5, schema) == ["/: matches 0 of the anyOf schemas"]


def test_one_of_needs_exactly_one_match() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"minimum": 5}]}
    assert validate(2, schema) == []
    assert validate(7.5, schema) == []
    assert validate(7, schema) == ["/: matches 2 of the oneOf schemas"]
    assert validate(1.5, schema) == ["/: matches 0 of the oneOf schemas"]


def test_all_of_reports_each_failing_schema() -> None:
    schema = {"allOf": [{"minimum": 6}, {"maximum": 4}, {"type": "integer"}]}
    assert validate(5, schema) == ["/: below the minimum 6", "/: above the maximum 4"]


def test_a_combinator_reports_at_its_own_pointer() -> None:
    schema = {"properties": {"v": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
    assert validate({"v": 1}, schema) == ["/v: matches 0 of the anyOf schemas"]


# --------------------------------------------------------------------------- $ref


def test_local_refs_to_defs_and_definitions() -> None:
    defs = {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
    assert validate({"a": 1}, defs) == []
    assert validate({"a": "1"}, defs) == ["/a: expected integer, got str"]
    definitions = {"definitions": {"s": {"type": "string"}}, "items": {"$ref": "#/definitions/s"}}
    assert validate(["x", 2], definitions) == ["/1: expected string, got int"]


def test_a_recursive_schema_through_a_hash_ref() -> None:
    tree = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["value"],
    }
    assert validate({"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}, tree) == []
    assert validate({"value": 1, "children": [{"value": 2, "children": [{}]}]}, tree) == [
        "/children/0/children/0: missing required property 'value'"
    ]


def test_keywords_beside_a_ref_apply_too() -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 5}
    assert validate(7, schema) == []
    assert validate("7", schema) == ["/: expected integer, got str"]
    assert validate(3, schema) == ["/: below the minimum 5"]


def test_a_pointer_with_escaped_names_resolves() -> None:
    schema = {"$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}}}
    assert validate("x", {**schema, "$ref": "#/$defs/a~1b"}) == []
    assert validate("x", {**schema, "$ref": "#/$defs/c~0d"}) == ["/: expected integer, got str"]


def test_only_local_refs_are_supported() -> None:
    with pytest.raises(ValueError, match=r"only local \$ref is supported, not 'other.json#/x'"):
        validate(1, {"$ref": "other.json#/x"})


def test_a_ref_to_something_that_is_not_a_schema_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"\$ref '#/\$defs/n' does not point at a schema"):
        validate(1, {"$defs": {"n": 5}, "$ref": "#/$defs/n"})


@pytest.mark.xfail(
    strict=True, raises=KeyError, reason="a $ref to a missing definition raises KeyError, not ValueError"
)
def test_a_ref_to_a_missing_definition_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate(1, {"$defs": {}, "$ref": "#/$defs/missing"})


# --------------------------------------------------------------------------- boolean schemas, annotations


def test_boolean_schemas() -> None:
    assert validate({"anything": [1, None]}, True) == []
    assert validate(None, False) == ["/: no value is allowed here"]


def test_unknown_keywords_and_annotations_are_ignored() -> None:
    schema = {
        "type": "string",
        "format": "email",
        "description": "d",
        "title": "t",
        "x-vendor": 1,
        "examples": ["e"],
    }
    assert validate("not an email", schema) == []


def test_an_empty_schema_accepts_everything() -> None:
    values: list[Any] = [{}, [], "", 0, 1.5, True, None]
    for value in values:
        assert validate(value, {}) == []


# --------------------------------------------------------------------------- limit


def test_at_most_limit_problems_are_returned_in_document_order() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    value = list(range(25))
    assert len(validate(value, schema)) == 10  # the default
    assert validate(value, schema, limit=3) == [
        "/0: expected string, got int",
        "/1: expected string, got int",
        "/2: expected string, got int",
    ]
    assert len(validate(value, schema, limit=100)) == 25


def test_the_limit_also_caps_problems_found_in_one_schema() -> None:
    schema = {"required": ["a", "b", "c", "d"]}
    assert validate({}, schema, limit=2) == [
        "/: missing required property 'a'",
        "/: missing required property 'b'",
    ]
