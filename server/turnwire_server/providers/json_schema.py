"""A small JSON Schema validator for structured output (``TurnConfig.output``).

Covers the keywords that structured-output schemas use (the subset OpenAI's
strict mode and Anthropic's JSON outputs accept, plus a few common ones):
``type`` (string or list), ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties`` (bool or schema), ``items``, ``prefixItems``,
``minItems``/``maxItems``, ``minLength``/``maxLength``, ``pattern``,
``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum``,
``anyOf``/``oneOf``/``allOf``, and local ``$ref`` (``#/$defs/…``,
``#/definitions/…``, ``#``). Unknown keywords (``format``, ``description`` …)
are ignored, as JSON Schema says annotations are.

:func:`validate` returns a list of problems (empty when valid), each naming the
JSON pointer of the offending value, at most ``limit`` of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(name, ()))


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise ValueError(f"only local $ref is supported, not {ref!r}")
    node: Any = root
    for token in ref[2:].split("/"):
        node = node[token.replace("~1", "/").replace("~0", "~")]
    if not isinstance(node, Mapping):
        raise ValueError(f"$ref {ref!r} does not point at a schema")
    return node


class _Run:
    """One validation: the root schema (for ``$ref``), the problems found, and how many to collect."""

    __slots__ = ("errors", "limit", "root")

    def __init__(self, root: Mapping[str, Any], limit: int) -> None:
        self.root = root
        self.errors: list[str] = []
        self.limit = limit


def validate(value: Any, schema: Mapping[str, Any] | bool, *, limit: int = 10) -> list[str]:
    """Problems of ``value`` against ``schema`` (empty list: valid)."""
    run = _Run(schema if isinstance(schema, Mapping) else {}, limit)
    _check(value, schema, "", run)
    return run.errors[:limit]


def _matches(value: Any, schema: Mapping[str, Any] | bool, run: _Run) -> bool:
    sub = _Run(run.root, 1)
    _check(value, schema, "", sub)
    return not sub.errors


def _check(value: Any, schema: Mapping[str, Any] | bool, path: str, run: _Run) -> None:
    errors = run.errors
    if len(errors) >= run.limit or schema is True:
        return
    if schema is False:
        errors.append(f"{path or '/'}: no value is allowed here")
        return
    where = path or "/"
    if "$ref" in schema:
        _check(value, _resolve(run.root, schema["$ref"]), path, run)
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is_type(value, name) for name in names):
            errors.append(f"{where}: expected {' or '.join(names)}, got {type(value).__name__}")
            return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: expected {schema['const']!r}")
    for sub in schema.get("allOf", ()):
        _check(value, sub, path, run)
    for keyword in ("anyOf", "oneOf"):
        options = schema.get(keyword)
        if options:
            matches = sum(1 for sub in options if _matches(value, sub, run))
            if matches == 0 or (keyword == "oneOf" and matches > 1):
                errors.append(f"{where}: matches {matches} of the {keyword} schemas")
    if isinstance(value, dict):
        _check_object(value, schema, path, run)
    elif isinstance(value, list):
        _check_array(value, schema, path, run)
    elif isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{where}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: does not match {schema['pattern']!r}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: above the maximum {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(f"{where}: not above {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            errors.append(f"{where}: not below {schema['exclusiveMaximum']}")


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str, run: _Run) -> None:
    errors = run.errors
    properties: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required", ()):
        if name not in value:
            errors.append(f"{path or '/'}: missing required property {name!r}")
    additional = schema.get("additionalProperties", True)
    for name, item in value.items():
        child = f"{path}/{name}"
        if name in properties:
            _check(item, properties[name], child, run)
        elif additional is False:
            errors.append(f"{child}: property is not allowed")
        elif isinstance(additional, Mapping):
            _check(item, additional, child, run)


def _check_array(value: list[Any], schema: Mapping[str, Any], path: str, run: _Run) -> None:
    errors = run.errors
    where = path or "/"
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{where}: fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{where}: more than {schema['maxItems']} items")
    prefix = schema.get("prefixItems") or ()
    for index, sub in enumerate(prefix[: len(value)]):
        _check(value[index], sub, f"{path}/{index}", run)
    items = schema.get("items")
    if items is not None:
        for index in range(len(prefix), len(value)):
            _check(value[index], items, f"{path}/{index}", run)
