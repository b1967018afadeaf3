"""Transcript helpers: JSON ↔ protobuf values, repair, and the continuation prompt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from google.protobuf import json_format, struct_pb2

from turnwire_client.v1 import message_pb2

CONTINUATION_PROMPT = (
    "Continue your previous response from exactly where it left off. Do not repeat any of it."
)
"""Sent (never stored) after a history ending in an assistant message (THINK-SEMANTICS.md section 1)."""

INTERRUPTED_TOOL_ERROR = "The tool call was interrupted before a result was recorded."
"""The result given to a tool call that has none (THINK-SEMANTICS.md section 8)."""

_UNRESOLVED = frozenset(
    {
        message_pb2.TOOL_CALL_STATE_UNSPECIFIED,
        message_pb2.TOOL_CALL_STATE_INPUT_STREAMING,
        message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED,
        message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
    }
)


def to_json_compatible(value: Any) -> Any:
    """``value`` as plain JSON types (dict, list, str, float/int, bool, None).

    Raises :class:`TypeError` when it cannot be serialized (orjson's rules:
    dataclasses, datetimes and pydantic-dumped values are fine).
    """
    if value is None or isinstance(value, str | bool | int | float):
        return value
    return orjson.loads(orjson.dumps(value))


def to_value(value: Any) -> struct_pb2.Value:
    """A JSON value as ``google.protobuf.Value``. Raises :class:`TypeError` if not JSON-serializable."""
    result = struct_pb2.Value()
    json_format.ParseDict(to_json_compatible(value), result)
    return result


def to_struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    """A JSON object as ``google.protobuf.Struct``."""
    result = struct_pb2.Struct()
    result.update(to_json_compatible(dict(value)))
    return result


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A ``Struct`` as a dict (numbers come back as floats, as JSON has no ints)."""
    return json_format.MessageToDict(struct)


def from_value(value: struct_pb2.Value) -> Any:
    """A ``Value`` as a plain JSON value."""
    return json_format.MessageToDict(value)


def repair_unresolved_tool_calls(
    messages: Sequence[message_pb2.Message],
) -> list[message_pb2.Message]:
    """Give every tool call without a result an errored result, in place.

    Returns the messages that changed (to be stored). A call whose input is
    not a JSON object keeps an empty object as input.
    """
    changed: list[message_pb2.Message] = []
    for message in messages:
        if message.role != message_pb2.ROLE_ASSISTANT:
            continue
        touched = False
        for part in message.parts:
            if part.WhichOneof("kind") != "tool_call":
                continue
            call = part.tool_call
            if call.state in _UNRESOLVED:
                call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
                call.error_text = INTERRUPTED_TOOL_ERROR
                call.preliminary = False
                touched = True
        if touched:
            changed.append(message)
    return changed


def text_of(message: message_pb2.Message) -> str:
    """The concatenated text parts of ``message``."""
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")
