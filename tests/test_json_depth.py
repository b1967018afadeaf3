"""``api/json_depth.py``: how deep a request's JSON values nest, and which field passes the limit
(docs/security.md, "JSON nested too deep"). Before, nothing measured it: a value nested past what
protobuf reads back was stored, then every read of it failed ``INTERNAL``."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.api.json_depth import MAX_JSON_DEPTH, json_depth, too_deep_field


def nested(levels: int, array: bool = False) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value] if array else {"a": value}
    return value


def struct_of(levels: int) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(nested(levels))
    return struct


def test_json_depth_counts_objects_and_arrays_of_json_and_of_protobuf() -> None:
    assert json_depth("scalar") == 0
    assert json_depth({}) == 1
    assert json_depth({"a": [1, {"b": []}]}) == 4
    assert json_depth(nested(10)) == 10
    assert json_depth(nested(10, array=True)) == 10
    assert json_depth(struct_of(7)) == 7
    value = struct_pb2.Value()
    value.list_value.values.add().struct_value.update({"a": {"b": 1}})
    assert json_depth(value) == 3


def test_json_depth_stops_past_the_limit_without_recursing() -> None:
    assert json_depth(nested(5000)) == MAX_JSON_DEPTH + 1  # far past Python's recursion limit
    assert json_depth(nested(12), limit=10) == 11


def test_too_deep_field_names_the_first_field_past_the_limit() -> None:
    # Built in place: protobuf copies a message assigned to a field, and refuses one this deep.
    fine = chat_service_pb2.ChatRequest()
    fine.body.update(nested(MAX_JSON_DEPTH))
    assert too_deep_field(fine) is None
    deep = chat_service_pb2.ChatRequest()
    deep.body.update(nested(MAX_JSON_DEPTH + 1))
    assert too_deep_field(deep) == "body"
    request = chat_service_pb2.ChatRequest()
    request.message.metadata.update(nested(5))
    request.message.parts.add().text.text = "hi"
    deep_part = request.message.parts.add()
    deep_part.reasoning.text = "deep"
    deep_part.reasoning.provider_metadata.update(nested(MAX_JSON_DEPTH + 1))
    assert too_deep_field(request) == "message.parts[1].reasoning.provider_metadata"
    tools = chat_service_pb2.SaveMessagesRequest()
    tools.client_tools.add(name="t").input_schema.update(nested(MAX_JSON_DEPTH + 1))
    assert too_deep_field(tools) == "client_tools[0].input_schema"
    schedule = chat_service_pb2.CreateScheduleRequest()
    schedule.schedule.input.body.update(nested(MAX_JSON_DEPTH + 1))
    assert too_deep_field(schedule) == "schedule.input.body"
