"""How deep a request's JSON values may nest: :data:`MAX_JSON_DEPTH` levels of objects and arrays.

A request carries free-form JSON as ``google.protobuf.Struct`` (a turn's ``body``, a message's
``metadata``, a client tool's ``input_schema``, a part's ``provider_metadata`` …). protobuf
decodes no message nested deeper than 100 levels, and each level of JSON is two of those
(``Struct`` → ``Value`` → ``Struct``), so a value that a request could still carry could not be
read back once stored one level further in (a ``Schedule``'s input, a conversation's messages,
a hook's request), and a door that copied it into a request failed with ``INTERNAL``. A request
is therefore refused (``INVALID_ARGUMENT``, naming the field) when any such value nests deeper
than :data:`MAX_JSON_DEPTH`: :func:`too_deep_field` for the messages of every RPC (the call
gate, both listeners), :func:`json_depth` for the JSON bodies of the HTTP doors.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any, Final

from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

MAX_JSON_DEPTH: Final = 32
"""The most levels of JSON objects and arrays a value of a request may nest (docs/security.md)."""

_JSON_TYPES: Final = frozenset(
    {
        struct_pb2.Struct.DESCRIPTOR.full_name,
        struct_pb2.Value.DESCRIPTOR.full_name,
        struct_pb2.ListValue.DESCRIPTOR.full_name,
    }
)


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The levels of objects (dicts, ``Struct``) and arrays (lists, ``ListValue``) ``value``
    nests (a scalar: 0), counted up to ``limit + 1`` only: a deeper value answers
    ``limit + 1``. Takes parsed JSON and protobuf's JSON types alike; never recurses."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, struct_pb2.Value):
            kind = node.WhichOneof("kind")
            if kind == "struct_value":
                node = node.struct_value
            elif kind == "list_value":
                node = node.list_value
            else:
                continue
        if isinstance(node, dict | struct_pb2.Struct):
            children: Any = node.values() if isinstance(node, dict) else node.fields.values()
        elif isinstance(node, list | struct_pb2.ListValue):
            children = node if isinstance(node, list) else node.values
        else:
            continue
        depth += 1
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def too_deep_field(message: Message, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The path (``body``, ``message.metadata``, ``client_tools[0].input_schema``) of the first
    JSON value in ``message`` that nests deeper than ``limit``, else None."""
    for path, value in _json_values(message, ""):
        if json_depth(value, limit) > limit:
            return path
    return None


def _json_values(message: Message, prefix: str) -> Iterator[tuple[str, Message]]:
    for field, is_json in _plan(message.DESCRIPTOR):
        name = prefix + field.name
        values: Iterator[tuple[str, Any]]
        if field.is_repeated:
            items = getattr(message, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                values = iter([(f"{name}[{key!r}]", item) for key, item in items.items()])
            else:
                values = ((f"{name}[{index}]", item) for index, item in enumerate(items))
        elif message.HasField(field.name):
            values = iter([(name, getattr(message, field.name))])
        else:
            continue
        for path, item in values:
            if not isinstance(item, Message):
                continue
            if is_json:
                yield path, item
            else:
                yield from _json_values(item, path + ".")


@cache
def _plan(descriptor: Descriptor) -> tuple[tuple[FieldDescriptor, bool], ...]:
    """The message fields of ``descriptor`` that are, or may hold, JSON values, each with
    whether it is one itself (a map's entries count by their values)."""
    plan: list[tuple[FieldDescriptor, bool]] = []
    for field in descriptor.fields:
        child = field.message_type
        if child is None:
            continue
        if child.GetOptions().map_entry:
            child = child.fields_by_name["value"].message_type
            if child is None:
                continue
        if child.full_name in _JSON_TYPES:
            plan.append((field, True))
        elif _may_hold_json(child, frozenset({descriptor.full_name})):
            plan.append((field, False))
    return tuple(plan)


def _may_hold_json(descriptor: Descriptor, visiting: frozenset[str]) -> bool:
    if descriptor.full_name in _JSON_TYPES:
        return True
    if descriptor.full_name in visiting:
        return False
    for field in descriptor.fields:
        child = field.message_type
        if child is None:
            continue
        if child.GetOptions().map_entry:
            child = child.fields_by_name["value"].message_type
            if child is None:
                continue
        if _may_hold_json(child, visiting | {descriptor.full_name}):
            return True
    return False


__all__ = ["MAX_JSON_DEPTH", "json_depth", "too_deep_field"]
