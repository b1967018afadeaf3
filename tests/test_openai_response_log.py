"""A turn's events read as OpenAI Responses events (server/turnwire_server/http/openai_response_log.py,
docs/api/openai.md#events), in process: every event validates against the ``openai`` SDK's own types,
numbers run 0, 1, 2 … without gaps, the same log always gives the same events (so a sequence number
is a resume cursor), and the Response adds up to what was streamed. The request body's mapping and
its refusals (openai_request.py) name the ``param`` to fix.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from support.event_logs import RESTARTED_STEP, SERVER_TOOL_TURN, turn_events

from turnwire_client.v1 import message_pb2
from turnwire_server.http.openai_request import RequestProblem, parse_request, turn_input
from turnwire_server.http.openai_response_log import ResponseLog

EVENT = TypeAdapter(ResponseStreamEvent)

TOOL_TURN = SERVER_TOOL_TURN


def translate(kinds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], ResponseLog]:
    log = ResponseLog("r1")
    out = [openai_event for event in turn_events(kinds) for openai_event in log.feed(event)]
    return out, log


def without_responses(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in event.items() if k != "response"} for event in events]


def test_a_tool_turn_reads_as_openai_events() -> None:
    events, log = translate(TOOL_TURN)
    for event in events:
        EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.function_call_arguments.delta") == 2
    response = Response.model_validate(log.snapshot())
    assert [item.type for item in response.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert response.output_text == "Let me check.42."
    assert response.usage is not None and response.usage.total_tokens == 16
    assert response.conversation is not None and response.conversation.id == "c"
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3, 4]  # every item opened is closed, in order


def test_the_same_log_gives_the_same_events() -> None:
    first, _ = translate(TOOL_TURN)
    again, _ = translate(TOOL_TURN)
    assert without_responses(first) == without_responses(again)


def test_a_cancelled_turn_closes_its_open_items() -> None:
    cut = [*TOOL_TURN[:7], {"turn_end": {"status": "TURN_STATUS_ABORTED"}}]
    events, log = translate(cut)
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"
    assert events[-1]["type"] == "response.incomplete" and log.response["status"] == "cancelled"


def test_a_restarted_attempt_closes_the_items_the_earlier_one_left_open() -> None:
    """A provider fallback restarts a step after output (``after_output: restart``): the earlier
    attempt's message was left ``in_progress`` in the completed Response, its item never done, and
    the new attempt's block (the same block id) took its place among the open items (developer
    trial)."""
    # Without its reasoning block: the Response's items are then the two attempts' messages.
    restarted = [event for event in RESTARTED_STEP if not next(iter(event)).startswith("reasoning")]
    events, log = translate(restarted)
    for event in events:
        EVENT.validate_python(event)
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1]  # the earlier attempt's item is done before the new one opens
    response = Response.model_validate(log.snapshot())
    assert [item.type for item in response.output] == ["message", "message"]
    assert [item["status"] for item in log.response["output"]] == ["incomplete", "completed"]
    assert response.status == "completed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"[]", None),
        (b'{"input": 5}', "input"),
        (b'{"input": [{"role": "robot", "content": "x"}]}', "input[0].role"),
        (b'{"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}', "input[0].content[0].type"),
        (b'{"input": [{"type": "function_call_output", "output": "x"}]}', "input[0].call_id"),
        (b'{"input": "hi", "tools": [{"type": "file_search"}]}', "tools[0].type"),
        (
            b'{"input": [{"role": "user", "content": "x"},'
            b' {"type": "function_call_output", "call_id": "c", "output": "1"}]}',
            "input",
        ),
    ],
)
def test_a_bad_body_names_its_param(body: bytes, param: str | None) -> None:
    with pytest.raises(RequestProblem) as refused:
        turn_input(parse_request(body))
    assert refused.value.param == param


def test_a_body_maps_to_messages_tools_and_hooks() -> None:
    turn = turn_input(
        parse_request(
            b'{"instructions": "Be brief.", "input": [{"role": "developer", "content": "Use metric."},'
            b' {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],'
            b' "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],'
            b' "temperature": 0.2, "metadata": {"k": "v"}, "unknown_new_field": 1}'
        )
    )
    assert [m.role for m in turn.messages] == [
        message_pb2.ROLE_SYSTEM,
        message_pb2.ROLE_SYSTEM,
        message_pb2.ROLE_USER,
    ]
    assert [tool.name for tool in turn.client_tools] == ["f"]
    assert turn.body == {"temperature": 0.2, "metadata": {"k": "v"}}
    plain = turn_input(
        parse_request(b'{"input": [{"type": "function_call_output", "call_id": "c", "output": "sunny"}]}')
    )
    assert plain.results[0].output_json == '"sunny"'  # not JSON: stored as a JSON string
