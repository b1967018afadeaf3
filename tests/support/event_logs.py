"""Turn event logs written as dicts, for the tests of the doors' translators
(``test_openai_response_log.py``, ``test_ai_sdk_chunks.py``)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from turnwire_client.v1 import event_pb2


def turn_events(kinds: list[dict[str, Any]]) -> list[event_pb2.TurnEvent]:
    """``TurnEvent`` s of conversation ``c``, request ``r1``, from their oneof fields as dicts
    (``{"text_delta": {"id": "t", "delta": "hi"}}``), numbered 1, 2 … as the engine numbers them;
    a ``progress`` keepalive gets sequence number 0."""
    events, number = [], 0
    for kind in kinds:
        keepalive = "progress" in kind
        number += 0 if keepalive else 1
        value = {
            "conversation_id": "c",
            "request_id": "r1",
            "sequence_number": 0 if keepalive else number,
            **kind,
        }
        events.append(json_format.ParseDict(value, event_pb2.TurnEvent()))
    return events
