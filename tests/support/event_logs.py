"""Turn event logs written as dicts, for the tests of the doors' translators
(``test_openai_response_log.py``, ``test_ai_sdk_chunks.py``, ``test_ag_ui_events.py``)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from turnwire_client.v1 import event_pb2


def turn_events(
    kinds: list[dict[str, Any]], conversation_id: str = "c", request_id: str = "r1"
) -> list[event_pb2.TurnEvent]:
    """``TurnEvent`` s of ``conversation_id``, request ``request_id``, from their oneof fields as dicts
    (``{"text_delta": {"id": "t", "delta": "hi"}}``), numbered 1, 2 … as the engine numbers them;
    a ``progress`` keepalive gets sequence number 0."""
    events, number = [], 0
    for kind in kinds:
        keepalive = "progress" in kind
        number += 0 if keepalive else 1
        value = {
            "conversation_id": conversation_id,
            "request_id": request_id,
            "sequence_number": 0 if keepalive else number,
            **kind,
        }
        events.append(json_format.ParseDict(value, event_pb2.TurnEvent()))
    return events


SERVER_TOOL_TURN: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
    {"step_start": {}},
    {"reasoning_start": {"id": "s0-r"}},
    {"reasoning_delta": {"id": "s0-r", "delta": "think"}},
    {"reasoning_end": {"id": "s0-r"}},
    {"text_start": {"id": "s0-t"}},
    {"text_delta": {"id": "s0-t", "delta": "Let me "}},
    {"text_delta": {"id": "s0-t", "delta": "check."}},
    {"text_end": {"id": "s0-t"}},
    {"tool_input_start": {"tool_call_id": "c1", "tool_name": "calculator"}},
    {"tool_input_delta": {"tool_call_id": "c1", "input_text_delta": '{"expression":'}},
    {"tool_input_delta": {"tool_call_id": "c1", "input_text_delta": '"6*7"}'}},
    {
        "tool_input_available": {
            "tool_call_id": "c1",
            "tool_name": "calculator",
            "input_json": '{"expression":"6*7"}',
        }
    },
    {
        "tool_output_available": {
            "tool_call_id": "c1",
            "tool_name": "calculator",
            "output_json": '{"result":42}',
        }
    },
    {"step_finish": {"finish_reason": "FINISH_REASON_TOOL_CALLS"}},
    {"progress": {"phase": "PROGRESS_PHASE_MODEL"}},  # a keepalive: no sequence number, no event
    {"step_start": {"step_number": 1}},
    {"text_start": {"id": "s1-t"}},
    {"text_delta": {"id": "s1-t", "delta": "42."}},
    {"text_end": {"id": "s1-t"}},
    {"step_finish": {"step_number": 1, "finish_reason": "FINISH_REASON_STOP"}},
    {"turn_end": {"status": "TURN_STATUS_COMPLETED", "usage": {"input_tokens": 10, "output_tokens": 6}}},
]
"""A two-step turn: reasoning, text, the sidecar's calculator call and result, a keepalive, the
answer; the log the doors' translators are tested on."""


RESTARTED_STEP: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
    {"step_start": {}},
    {"reasoning_start": {"id": "s0-r"}},
    {"reasoning_delta": {"id": "s0-r", "delta": "hm"}},
    {"text_start": {"id": "s0-t"}},
    {"text_delta": {"id": "s0-t", "delta": "Partial "}},
    {"attempt_start": {"attempt": 2, "reason": "PROVIDER_FALLBACK", "model": "scripted:y"}},
    {"step_start": {}},
    {"text_start": {"id": "s0-t"}},
    {"text_delta": {"id": "s0-t", "delta": "Whole."}},
    {"text_end": {"id": "s0-t"}},
    {"step_finish": {"finish_reason": "FINISH_REASON_STOP"}},
    {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
]
"""A step a provider fallback restarts after output (``fallback.after_output: restart``): the
failed attempt's blocks and step are left open by its events."""
