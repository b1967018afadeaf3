"""``turnwire_server.providers.json_schema``: the structured-output validator on its own.

The checking itself is the ``jsonschema`` library's (Draft 2020-12); these tests
pin what Turnwire relies on: which values pass, the JSON pointer of each problem
(RFC 6901), the key facts its message names (not the library's exact prose),
``$ref``, the limit, and a ValueError for a schema that cannot be used.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from turnwire_server.providers.json_schema import validate


def pointers(problems: list[str]) -> list[str]:
    """The JSON pointer of each problem (what comes before the first ``": "``)."""
    return [problem.split(": ", 1)[0] for problem in problems]


def only_problem(value: Any, schema: Any) -> tuple[str, str]:
    """``(pointer, message)`` of the one problem ``value`` has against ``schema``."""
    problems = validate(value, schema)
    assert len(problems) == 1, problems
    pointer, message = problems[0].split(": ", 1)
    return pointer, message


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
    ],
)
def test_type(value: Any, type_: str, ok: bool) -> None:
    if ok:
        assert validate(value, {"type": type_}) == []
    else:
        pointer, message = only_problem(value, {"type": type_})
        assert pointer == "/"
        assert repr(value) in message
        assert repr(type_) in message


def test_an_unknown_type_name_is_an_invalid_schema() -> None:
    with pytest.raises(ValueError, match=r"invalid JSON Schema at \$\.type"):
        validate({}, {"type": "no-such-type"})


def test_a_list_of_types_accepts_any_of_them() -> None:
    schema = {"type": ["integer", "null"]}
    assert validate(None, schema) == []
    assert validate(4, schema) == []
    pointer, message = only_problem("4", schema)
    assert pointer == "/"
    assert "'integer'" in message and "'null'" in message


def test_a_wrong_type_is_reported_first_and_other_keywords_still_apply() -> None:
    schema = {"type": "string", "minLength": 3, "enum": ["abc"]}
    problems = validate(7, schema)
    assert pointers(problems) == ["/", "/"]  # the type, and the enum (minLength is for strings only)
    assert "'string'" in problems[0]
    assert "'abc'" in problems[1]


# --------------------------------------------------------------------------- enum, const


def test_enum_and_const() -> None:
    assert validate("b", {"enum": ["a", "b"]}) == []
    pointer, message = only_problem("c", {"enum": ["a", "b"]})
    assert pointer == "/"
    assert "'c'" in message and "['a', 'b']" in message
    assert validate({"k": [1]}, {"const": {"k": [1]}}) == []
    pointer, message = only_problem(2, {"const": 3})
    assert pointer == "/"
    assert "3" in message
    assert validate(1.0, {"const": 1}) == []  # equal numbers, as in JSON Schema


def test_enum_and_const_keep_booleans_and_numbers_apart() -> None:
    assert validate(True, {"enum": [1, 2]}) != []
    assert validate(0, {"const": False}) != []
    assert validate(1, {"enum": [True]}) != []
    assert validate(True, {"enum": [True]}) == []


# --------------------------------------------------------------------------- objects


def test_required_properties() -> None:
    schema = {"type": "object", "required": ["a", "b"]}
    assert validate({"a": 1, "b": None}, schema) == []
    problems = validate({}, schema)
    assert pointers(problems) == ["/", "/"]
    assert "'a'" in problems[0] and "'b'" in problems[1]


def test_properties_are_checked_at_their_pointer() -> None:
    schema = {
        "type": "object",
        "properties": {"inner": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    }
    assert validate({"inner": {"n": 1}}, schema) == []
    pointer, message = only_problem({"inner": {"n": "1"}}, schema)
    assert pointer == "/inner/n"
    assert "'integer'" in message
    assert validate({"inner": {"n": 1}, "extra": "anything"}, schema) == []  # allowed by default


def test_additional_properties_false_refuses_unknown_names() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert validate({"a": 1}, schema) == []
    pointer, message = only_problem({"a": 1, "b": 2, "c": 3}, schema)
    assert pointer == "/"  # one problem, at the object, naming every unexpected property
    assert "'b'" in message and "'c'" in message
    assert "'a'" not in message


def test_additional_properties_schema_checks_unknown_names() -> None:
    schema = {"properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}}
    assert validate({"a": "x", "b": 2}, schema) == []
    pointer, message = only_problem({"a": "x", "b": "2"}, schema)
    assert pointer == "/b"
    assert "'integer'" in message


def test_a_false_property_schema_refuses_any_value() -> None:
    [problem] = validate({"a": 1}, {"properties": {"a": False}})
    assert "1" in problem.split(": ", 1)[1]
    assert validate({}, {"properties": {"a": False}}) == []


@pytest.mark.xfail(
    strict=True,
    reason="jsonschema 4.26 reports a false subschema's problem at the containing value: "
    "Validator.descend() yields it before adding the property name or index to its path",
)
def test_a_false_subschema_problem_is_at_its_own_pointer() -> None:
    assert pointers(validate({"a": 1}, {"properties": {"a": False}})) == ["/a"]


def test_pointers_escape_slash_and_tilde_in_property_names() -> None:
    schema = {"properties": {"a/b": {"type": "string"}, "c~d": {"type": "string"}}}
    problems = validate({"a/b": 1, "c~d": 2}, schema)
    assert pointers(problems) == ["/a~1b", "/c~0d"]


def test_a_name_with_both_is_escaped_tilde_first() -> None:
    # "~1" in a name must not come out as "~1" (which would read back as "/").
    problems = validate({"~1/": 1}, {"additionalProperties": {"type": "string"}})
    assert pointers(problems) == ["/~01~1"]


# --------------------------------------------------------------------------- arrays


def test_items_apply_to_every_element() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    assert validate(["a", "b"], schema) == []
    problems = validate(["a", 2, "c", None], schema)
    assert pointers(problems) == ["/1", "/3"]
    assert all("'string'" in problem for problem in problems)


def test_prefix_items_then_items_for_the_rest() -> None:
    schema = {"prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": {"type": "integer"}}
    assert validate(["a", True, 1, 2], schema) == []
    assert validate(["a"], schema) == []  # shorter than the prefix is fine
    problems = validate([1, True, "x"], schema)
    assert pointers(problems) == ["/0", "/2"]
    assert "'string'" in problems[0] and "'integer'" in problems[1]


def test_min_and_max_items() -> None:
    assert validate([1], {"minItems": 1, "maxItems": 2}) == []
    assert pointers(validate([], {"minItems": 1})) == ["/"]
    assert pointers(validate([1, 2, 3], {"maxItems": 2})) == ["/"]


def test_pointers_nest_through_arrays_and_objects() -> None:
    schema = {"items": {"properties": {"tags": {"items": {"type": "string"}}}}}
    problems = validate([{"tags": ["a"]}, {"tags": ["b", 3]}], schema)
    assert pointers(problems) == ["/1/tags/1"]


# --------------------------------------------------------------------------- strings and numbers


def test_string_length_and_pattern() -> None:
    schema = {"minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"}
    assert validate("abc", schema) == []
    assert pointers(validate("a", schema)) == ["/"]
    assert pointers(validate("abcde", schema)) == ["/"]
    pointer, message = only_problem("AB", schema)
    assert pointer == "/"
    assert "'^[a-z]+$'" in message


def test_a_long_value_is_cut_in_the_middle_of_its_message() -> None:
    [problem] = validate("x" * 10_000, {"maxLength": 3})
    assert len(problem) < 300
    assert problem.startswith("/: 'xxx")
    assert "…" in problem
    assert problem.endswith("is too long")  # what is wrong survives the cut


def test_a_pattern_matches_anywhere_unless_anchored() -> None:
    assert validate("xx42yy", {"pattern": "[0-9]+"}) == []


def test_string_keywords_do_not_apply_to_other_types() -> None:
    assert validate(5, {"minLength": 10, "pattern": "^x$"}) == []
    assert validate("x", {"minimum": 10}) == []


def test_minimum_and_maximum_are_inclusive() -> None:
    schema = {"minimum": 1, "maximum": 3}
    assert [validate(n, schema) for n in (1, 2, 3, 2.5)] == [[], [], [], []]
    pointer, message = only_problem(0, schema)
    assert (pointer, "1" in message) == ("/", True)
    pointer, message = only_problem(3.5, schema)
    assert (pointer, "3" in message) == ("/", True)


def test_exclusive_minimum_and_maximum() -> None:
    schema = {"exclusiveMinimum": 1, "exclusiveMaximum": 3}
    assert validate(2, schema) == []
    assert pointers(validate(1, schema)) == ["/"]
    assert pointers(validate(3, schema)) == ["/"]


def test_number_keywords_do_not_apply_to_booleans() -> None:
    assert validate(True, {"minimum": 5}) == []


# --------------------------------------------------------------------------- combinators


def test_any_of() -> None:
    schema = {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 10}]}
    assert validate("x", schema) == []
    assert validate(11, schema) == []
    assert pointers(validate(5, schema)) == ["/"]


def test_one_of_needs_exactly_one_match() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"minimum": 5}]}
    assert validate(2, schema) == []
    assert validate(7.5, schema) == []
    assert pointers(validate(7, schema)) == ["/"]  # both match
    assert pointers(validate(1.5, schema)) == ["/"]  # neither matches


def test_all_of_reports_each_failing_schema() -> None:
    schema = {"allOf": [{"minimum": 6}, {"maximum": 4}, {"type": "integer"}]}
    problems = validate(5, schema)
    assert pointers(problems) == ["/", "/"]
    assert "6" in problems[0] and "4" in problems[1]


def test_a_combinator_reports_at_its_own_pointer() -> None:
    schema = {"properties": {"v": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
    assert pointers(validate({"v": 1}, schema)) == ["/v"]


# --------------------------------------------------------------------------- $ref


def test_local_refs_to_defs_and_definitions() -> None:
    defs = {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
    assert validate({"a": 1}, defs) == []
    assert pointers(validate({"a": "1"}, defs)) == ["/a"]
    definitions = {"definitions": {"s": {"type": "string"}}, "items": {"$ref": "#/definitions/s"}}
    assert pointers(validate(["x", 2], definitions)) == ["/1"]


def test_a_recursive_schema_through_a_hash_ref() -> None:
    tree = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["value"],
    }
    assert validate({"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}, tree) == []
    pointer, message = only_problem({"value": 1, "children": [{"value": 2, "children": [{}]}]}, tree)
    assert pointer == "/children/0/children/0"
    assert "'value'" in message


def test_a_value_nested_too_deeply_is_a_problem_not_a_crash() -> None:
    tree = {"type": "array", "items": {"$ref": "#"}}
    value: list[Any] = []
    for _ in range(1_000):  # orjson parses up to 1024 levels; Python recursion runs out first
        value = [value]
    problems = validate(value, tree)
    assert pointers(problems) == ["/"]
    assert "nested too deeply" in problems[0]


def test_keywords_beside_a_ref_apply_too() -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 5}
    assert validate(7, schema) == []
    pointer, message = only_problem("7", schema)
    assert (pointer, "'integer'" in message) == ("/", True)
    pointer, message = only_problem(3, schema)
    assert (pointer, "5" in message) == ("/", True)


def test_a_pointer_with_escaped_names_resolves() -> None:
    schema = {"$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}}}
    assert validate("x", {**schema, "$ref": "#/$defs/a~1b"}) == []
    pointer, message = only_problem("x", {**schema, "$ref": "#/$defs/c~0d"})
    assert (pointer, "'integer'" in message) == ("/", True)


@pytest.mark.parametrize(
    "ref",
    ["other.json#/x", "https://example.com/schema.json", "http://127.0.0.1:9/never-fetched.json"],
)
def test_refs_outside_the_schema_are_value_errors_and_never_fetched(
    ref: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fetching(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"fetched {args}")

    monkeypatch.setattr(urllib.request, "urlopen", no_fetching)
    with pytest.raises(ValueError, match=r"\$ref .* does not resolve") as raised:
        validate(1, {"$ref": ref})
    assert ref in str(raised.value)


def test_a_ref_to_something_that_is_not_a_schema_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"invalid JSON Schema at .*\$defs.*n"):
        validate(1, {"$defs": {"n": 5}, "$ref": "#/$defs/n"})


def test_a_ref_to_a_missing_definition_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"\$ref .*\$defs/missing.* does not resolve"):
        validate(1, {"$defs": {}, "$ref": "#/$defs/missing"})


# --------------------------------------------------------------------------- invalid schemas


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "strnig"}, "$.type"),
        ({"pattern": "["}, "$.pattern"),
        ({"minLength": "3"}, "$.minLength"),
        ({"required": "a"}, "$.required"),
        ({"properties": {"a": {"type": 3}}}, "$.properties.a.type"),
    ],
)
def test_an_invalid_schema_is_a_value_error_saying_where(schema: dict[str, Any], where: str) -> None:
    with pytest.raises(ValueError, match="invalid JSON Schema") as raised:
        validate("x", schema)
    assert where in str(raised.value)


# --------------------------------------------------------------------------- boolean schemas, annotations


def test_boolean_schemas() -> None:
    assert validate({"anything": [1, None]}, True) == []
    assert pointers(validate(None, False)) == ["/"]


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


def test_at_most_limit_problems_are_returned_in_item_order() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    value = list(range(25))
    assert len(validate(value, schema)) == 10  # the default
    assert pointers(validate(value, schema, limit=3)) == ["/0", "/1", "/2"]
    assert len(validate(value, schema, limit=100)) == 25


def test_the_limit_also_caps_problems_found_in_one_schema() -> None:
    schema = {"required": ["a", "b", "c", "d"]}
    problems = validate({}, schema, limit=2)
    assert len(problems) == 2
    assert "'a'" in problems[0] and "'b'" in problems[1]
