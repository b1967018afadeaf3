"""JSON values kept exactly, and their protobuf convenience view (``Struct`` / ``Value``).

docs/semantics.md §11 (Decision: exact values). Tool inputs and outputs are JSON
text in the contract (``ToolCallPart.input_json`` / ``output_json``): integers of
any size stay exact and the model's own argument text is what is replayed to it.
A ``Struct``/``Value`` (every number a double, nesting bounded by protobuf's
recursion limit) is offered only as a view, and only when it is exact:
:func:`struct_view` / :func:`value_view` return ``None`` otherwise.

Text is parsed with the standard library (integers of any size exactly; ``NaN``
and ``Infinity`` refused) and written by :func:`dumps`, which refuses non-finite
numbers with the JSON path where they are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf import struct_pb2

from turnwire.errors import DomainError
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_client.values import EXACT_INTEGER_LIMIT, struct_number

VIEW_MAX_DEPTH = 20
"""Deepest nesting a ``Struct``/``Value`` view is made for (each level is two protobuf
messages deep; readers' default recursion limit is 100)."""


class NotJsonError(DomainError, ValueError):
    """A value cannot be written as JSON: ``path`` (``$.a[0]``) says where, ``args[0]`` why.

    A tool output with no JSON form fails the call (docs/semantics.md §11, exact values): the
    model sees it, no client gets it as a status (no ``ErrorReason`` of its own)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{problem} at {path}")
        self.path = path


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str) -> Any:
    """Parse JSON text exactly: integers of any size as ``int``; ``NaN``/``Infinity`` refused.

    Raises :class:`ValueError` (``json.JSONDecodeError`` for syntax) when it is not JSON,
    and for nesting too deep to parse (Python's recursion limit).
    """
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def normalize(value: Any) -> Any:
    """``value`` as plain JSON types (dict with str keys, list, str, int, float, bool, None).

    Types JSON has no word for (dataclasses, datetimes, enums, pydantic-dumped values …) go
    through orjson's rules. Raises :class:`NotJsonError` naming the path of a non-finite
    number or of a value that cannot be serialized.
    """
    return _normalize(value, "$")


def _normalize(value: Any, path: str) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJsonError(path, f"the number {value} is not JSON (NaN and Infinity have no JSON form)")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJsonError(path, f"the key {key!r} is not a string")
            out[key] = _normalize(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_normalize(item, f"{path}[{index}]") for index, item in enumerate(value)]
    try:
        converted = orjson.loads(orjson.dumps(value))
    except TypeError as error:
        raise NotJsonError(path, f"{type(value).__name__} is not JSON-serializable ({error})") from None
    return _normalize(converted, path)


def dumps(value: Any) -> str:
    """Compact JSON text of ``value``, exact (integers of any size) and non-ASCII kept as is.

    Raises :class:`NotJsonError` naming where a value has no JSON form (NaN, Infinity, an
    object that cannot be serialized).
    """
    try:
        return json.dumps(normalize(value), separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise NotJsonError("$", "the value is nested too deeply") from None


def parse_tool_input(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(input, error)`` for a model's tool-input text.

    ``""`` and whitespace are ``{}`` (a call without arguments); anything that
    is not a JSON object is an error whose text says why and quotes the first
    200 characters; the input is then ``None`` and the call is not run.
    """
    if not raw or raw.isspace():
        return {}, None
    try:
        value = loads(raw)
    except ValueError as error:
        return None, f"The tool input is not valid JSON ({error}): {raw[:200]!r}"
    if not isinstance(value, dict):
        return None, f"The tool input is not a JSON object: {raw[:200]!r}"
    return value, None


# --- protobuf views -----------------------------------------------------------------------


def _viewable(value: Any, depth: int) -> bool:
    if depth > VIEW_MAX_DEPTH:
        return False
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return abs(value) <= EXACT_INTEGER_LIMIT
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_viewable(item, depth + 1) for item in value.values())
    if isinstance(value, list):
        return all(_viewable(item, depth + 1) for item in value)
    return False


def value_view(value: Any) -> struct_pb2.Value | None:
    """``value`` (plain JSON types) as a ``google.protobuf.Value``, or None when the view would not
    be exact (an integer past 2**53, nesting deeper than :data:`VIEW_MAX_DEPTH`)."""
    if not _viewable(value, 0):
        return None
    result = struct_pb2.Value()
    _fill(result, value)
    return result


def struct_view(value: Mapping[str, Any]) -> struct_pb2.Struct | None:
    """A JSON object as a ``google.protobuf.Struct``, or None when the view would not be exact."""
    if not _viewable(dict(value), 0):
        return None
    result = struct_pb2.Struct()
    result.update(value)
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
    else:  # normalize returns nothing else
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def from_value(value: struct_pb2.Value) -> Any:
    """A ``google.protobuf.Value`` as plain JSON; numbers as
    :func:`turnwire_client.values.struct_number` reads them (integral ones below 2**53 as ints)."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return struct_number(value.number_value)
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


# --- tool call parts ----------------------------------------------------------------------


def tool_call_input(call: message_pb2.ToolCallPart) -> dict[str, Any]:
    """A tool call part's input, exactly: ``input_json`` when set, else the ``input`` view
    (parts stored before ``input_json`` existed); ``{}`` for an input that was not an object."""
    if call.input_json:
        value = loads(call.input_json)
        return value if isinstance(value, dict) else {}
    return from_struct(call.input)


def tool_call_output_json(call: message_pb2.ToolCallPart | event_pb2.ToolOutputAvailable) -> str:
    """A tool call part's output as JSON text: the one accessor every reader uses (the provider
    adapters, compaction's sizes and elisions, the tool-result RPCs, the CLI, traces); also for a
    ``ToolOutputAvailable`` event, which carries the same two fields.

    ``output_json`` when set (exact, docs/semantics.md §11); else the deprecated ``output``
    ``Value`` written as JSON (a part a client stored through ``AddMessages`` or an older client
    with only that field); ``""`` when the part has neither. Raises :class:`NotJsonError` for a
    ``Value`` holding a non-finite number (protobuf allows NaN, JSON does not).
    """
    if call.output_json:
        return call.output_json
    if call.HasField("output"):
        return dumps(from_value(call.output))
    return ""


def tool_call_output(call: message_pb2.ToolCallPart) -> Any:
    """A tool call part's output as a value (:func:`tool_call_output_json` parsed), ``None`` when
    the part has none."""
    text = tool_call_output_json(call)
    return loads(text) if text else None
