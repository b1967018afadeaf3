"""JSON values and their protobuf form (``google.protobuf.Value`` / ``Struct``): one set of rules.

Tool inputs, tool outputs and provider metadata travel in the contract as
``Struct``/``Value``. ``Struct`` stores every number as a double, so reading
one back turns integral numbers below 2**53 into ``int`` again (a double holds
those exactly); larger or fractional numbers stay ``float``. Tool input text
from a model is parsed by :func:`parse_tool_input`, the one place that decides
what a valid tool input is and what the error says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf import struct_pb2

_EXACT_INT_LIMIT = 2**53


def to_json_compatible(value: Any) -> Any:
    """``value`` as plain JSON types (dict, list, str, int, float, bool, None).

    Raises :class:`TypeError` when it cannot be serialized (orjson's rules:
    dataclasses, datetimes and pydantic-dumped values are fine).
    """
    if value is None or isinstance(value, str | bool | int | float):
        return value
    return orjson.loads(orjson.dumps(value))


def to_value(value: Any) -> struct_pb2.Value:
    """A JSON value as ``google.protobuf.Value``. Raises :class:`TypeError` if not JSON-serializable."""
    result = struct_pb2.Value()
    _fill(result, to_json_compatible(value))
    return result


def to_struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    """A JSON object as ``google.protobuf.Struct``. Raises :class:`TypeError` if not JSON-serializable."""
    result = struct_pb2.Struct()
    result.update(to_json_compatible(dict(value)))
    return result


def _fill(target: struct_pb2.Value, value: Any) -> None:
    if value is None:
        target.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int | float):
        target.number_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, dict):
        target.struct_value.update(value)
    elif isinstance(value, list):
        target.list_value.extend(value)
    else:  # to_json_compatible returns nothing else
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def from_value(value: struct_pb2.Value) -> Any:
    """A ``google.protobuf.Value`` as plain JSON; integral numbers below 2**53 come back as ints."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) < _EXACT_INT_LIMIT else number
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [from_value(item) for item in value.list_value.values]
    return None


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A ``Struct`` as a dict (numbers as in :func:`from_value`)."""
    return {key: from_value(item) for key, item in struct.fields.items()}


def dumps(value: Any) -> str:
    """Compact JSON text of ``value``. Raises :class:`TypeError` if not JSON-serializable."""
    return orjson.dumps(value).decode()


def parse_tool_input(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(input, error)`` for a model's tool-input text.

    ``""`` and whitespace are ``{}`` (a call without arguments); anything that
    is not a JSON object is an error whose text says why and quotes the first
    200 characters; the input is then ``None`` and the call is not run.
    """
    if not raw or raw.isspace():
        return {}, None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return None, f"The tool input is not valid JSON ({error}): {raw[:200]!r}"
    if not isinstance(value, dict):
        return None, f"The tool input is not a JSON object: {raw[:200]!r}"
    return value, None
