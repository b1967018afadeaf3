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

from functools import cache
from typing import Any, Final

from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor
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
    JSON value in ``message`` that nests deeper than ``limit``, else None. Visits only the fields
    that are set and can hold such a value (``ListFields``: a request's unset fields cost nothing),
    and builds a path only for the value it reports."""
    plan = _plan(message.DESCRIPTOR)
    if not plan:
        return None
    for field, value in message.ListFields():
        kind = plan.get(field.number)
        if kind is None:
            continue
        is_json, is_map = kind
        if is_map:
            items: Any = value.items()
        elif field.is_repeated:
            items = enumerate(value)
        else:
            found = _too_deep_in(value, is_json, limit)
            if found is not None:
                return field.name + found
            continue
        for key, item in items:
            found = _too_deep_in(item, is_json, limit)
            if found is not None:
                return f"{field.name}[{key!r}]{found}" if is_map else f"{field.name}[{key}]{found}"
    return None


def _too_deep_in(item: Any, is_json: bool, limit: int) -> str | None:
    # "" when ``item`` itself is the value too deep, ".<path>" for one inside it, else None.
    if not isinstance(item, Message):
        return None
    if is_json:
        return "" if json_depth(item, limit) > limit else None
    inner = too_deep_field(item, limit)
    return None if inner is None else "." + inner


@cache
def _plan(descriptor: Descriptor) -> dict[int, tuple[bool, bool]]:
    """The message fields of ``descriptor`` that are, or may hold, JSON values, by field number:
    whether each is one itself (a map's entries count by their values) and whether it is a map."""
    plan: dict[int, tuple[bool, bool]] = {}
    for field in descriptor.fields:
        child = field.message_type
        if child is None:
            continue
        is_map = bool(child.GetOptions().map_entry)
        if is_map:
            child = child.fields_by_name["value"].message_type
            if child is None:
                continue
        if child.full_name in _JSON_TYPES:
            plan[field.number] = (True, is_map)
        elif _may_hold_json(child, frozenset({descriptor.full_name})):
            plan[field.number] = (False, is_map)
    return plan


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
