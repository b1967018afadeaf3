"""A turn's events read as OpenAI Responses events (server/turnwire_server/http/openai_response_log.py,
docs/api/openai.md#events), in process: every event validates against the ``openai`` SDK's own types,
numbers run 0, 1, 2 … without gaps, the same log always gives the same events (so a sequence number
is a resume cursor), and the Response adds up to what was streamed. The request body's mapping and
its refusals (openai_request.py) name the ``param`` to fix.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall
from pydantic import TypeAdapter
from support.event_logs import RESTARTED_STEP, SERVER_TOOL_TURN, turn_events

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.engine.ids import approval_turn, new_approval_id
from turnwire_server.http.openai_request import (
    ApprovalAnswer,
    RequestProblem,
    parse_request,
    referenced_response,
    turn_input,
)
from turnwire_server.http.openai_response_log import ResponseLog, stored_events, stored_log

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
    assert "response.mcp_call.completed" in kinds and "response.function_call_arguments.delta" not in kinds
    response = Response.model_validate(log.snapshot())
    assert [item.type for item in response.output] == ["reasoning", "message", "mcp_call", "message"]
    assert response.output_text == "Let me check.42."
    assert response.usage is not None and response.usage.total_tokens == 16
    assert response.conversation is not None and response.conversation.id == "c"
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]  # every item opened is closed, in order


def test_a_call_the_sidecar_ran_is_an_mcp_call_and_a_client_call_a_function_call() -> None:
    """A call of the sidecar's own tools is OpenAI's ``mcp_call`` (a tool the server ran, with its
    output), a client tool's call a ``function_call`` for the caller to answer. Before, a server
    tool's call was a ``function_call`` followed by a ``function_call_output`` item, which is no
    Responses output item: the AI SDK refused the whole Response ("Invalid JSON response") and,
    streamed, took the call for one it had to run (``NoSuchToolError``, finish ``tool-calls``)."""
    events, log = translate(TOOL_TURN)
    call = next(item for item in log.response["output"] if item["type"] == "mcp_call")
    assert {k: call[k] for k in ("name", "arguments", "output", "error", "status", "server_label")} == {
        "name": "calculator",
        "arguments": '{"expression":"6*7"}',
        "output": '{"result":42}',
        "error": None,
        "status": "completed",
        "server_label": "turnwire",
    }
    kinds = [e["type"] for e in events if "mcp" in e["type"] or e.get("item", {}).get("type") == "mcp_call"]
    assert kinds == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    client_call = [
        {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
        {"tool_input_start": {"tool_call_id": "c9", "tool_name": "get_location"}},
        {"tool_input_delta": {"tool_call_id": "c9", "input_text_delta": '{"precision":'}},
        {
            "tool_input_available": {
                "tool_call_id": "c9",
                "tool_name": "get_location",
                "input_json": '{"precision":1}',
            }
        },
        {
            "tool_output_error": {
                "tool_call_id": "c8",
                "tool_name": "get_weather",
                "error_text": "no such city",
            }
        },
        {"step_finish": {"finish_reason": "FINISH_REASON_TOOL_CALLS"}},
        {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
    ]
    events, log = translate(client_call)
    for event in events:
        EVENT.validate_python(event)
    response = Response.model_validate(log.snapshot())
    assert [item.type for item in response.output] == ["mcp_call", "function_call"]
    failed, asked = log.response["output"]
    assert failed["status"] == "failed" and failed["error"]["content"][0]["text"] == "no such city"
    assert (asked["call_id"], asked["arguments"], asked["status"]) == ("c9", '{"precision":1}', "completed")
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"precision":1}']


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


def test_a_history_of_item_references_continues_the_response_of_the_last() -> None:
    """The AI SDK's OpenAI provider sends the earlier steps of its history as ``item_reference``
    items: the last one of this door's items names the response to continue, the input after it
    is new; with a conversation or previous response named, or ids no response of this door made,
    nothing is inferred."""
    body = (
        b'{"input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_resp-a_0"},'
        b' {"type": "item_reference", "id": "fc_chatcmpl-b.1_2"},'
        b' {"type": "function_call_output", "call_id": "c", "output": "1"}]}'
    )
    assert referenced_response(parse_request(body)) == ("chatcmpl-b.1", 3)
    assert turn_input(parse_request(body), 3).results[0].tool_call_id == "c"
    named = body.replace(b'{"input"', b'{"conversation": "x", "input"')
    assert referenced_response(parse_request(named)) is None
    foreign = b'{"input": [{"type": "item_reference", "id": "msg_abc"}, {"role": "user", "content": "x"}]}'
    assert referenced_response(parse_request(foreign)) is None


APPROVAL_TURN: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
    {"text_start": {"id": "t"}},
    {"text_delta": {"id": "t", "delta": "Let me look."}},
    {"text_end": {"id": "t"}},
    {"tool_input_start": {"tool_call_id": "c1", "tool_name": "get_weather"}},
    {"tool_input_delta": {"tool_call_id": "c1", "input_text_delta": '{"city":"Paris"}'}},
    {
        "tool_input_available": {
            "tool_call_id": "c1",
            "tool_name": "get_weather",
            "input_json": '{"city":"Paris"}',
        }
    },
    {"tool_approval_request": {"tool_call_id": "c1", "approval_id": "tw-ap-1", "tool_name": "get_weather"}},
    {"step_finish": {"finish_reason": "FINISH_REASON_TOOL_CALLS"}},
    {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
]


def test_a_call_waiting_for_approval_is_an_mcp_approval_request() -> None:
    """A call of the sidecar's own tools waiting for the user's approval is OpenAI's
    ``mcp_approval_request`` (its ``id`` the approval's, to answer with ``mcp_approval_response``).
    Before, it was a ``function_call``: a client tool's call, which an OpenAI client runs itself
    (or fails on, having no such tool) and answers with a ``function_call_output`` the sidecar
    refuses."""
    events, log = translate(APPROVAL_TURN)
    for event in events:
        EVENT.validate_python(event)
    response = Response.model_validate(log.snapshot())
    assert [item.type for item in response.output] == ["message", "mcp_approval_request"]
    request = McpApprovalRequest.model_validate(log.response["output"][1])
    assert (request.id, request.server_label, request.name) == ("tw-ap-1", "turnwire", "get_weather")
    assert request.arguments == '{"city":"Paris"}'
    assert "status" not in log.response["output"][1]  # OpenAI's item has none
    kinds = [e["type"] for e in events if e.get("item", {}).get("type") == "mcp_approval_request"]
    assert kinds == ["response.output_item.added", "response.output_item.done"]
    assert response.status == "completed"


def test_a_stored_turn_shows_its_approval_request_as_when_it_ended() -> None:
    """Past the event retention a response is made from its stored reply, where the call has
    since been approved and run (or denied): it still reads as the approval request it ended on."""
    reply = message_pb2.Message(id="tw-a-r1", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().text.text = "Let me look."
    call = reply.parts.add().tool_call
    call.tool_call_id, call.tool_name, call.input_json = "c1", "get_weather", '{"city":"Paris"}'
    call.approval.id, call.approval.approved = "tw-ap-1", True
    call.state, call.output_json = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE, '{"sky":"clear"}'
    turn = chat_service_pb2.Turn(request_id="r1", conversation_id="c", status=event_pb2.TURN_STATUS_COMPLETED)
    log = stored_log(turn)
    for event in stored_events(turn, reply):
        log.feed(event)
    response = Response.model_validate(log.snapshot())
    assert [item.type for item in response.output] == ["message", "mcp_approval_request"]
    assert McpApprovalRequest.model_validate(log.response["output"][1]).id == "tw-ap-1"


def test_mcp_approval_response_items_are_approval_answers() -> None:
    turn = turn_input(
        parse_request(
            b'{"previous_response_id": "resp-a", "input": [{"type": "mcp_approval_response",'
            b' "approval_request_id": "tw-ap-1", "approve": false, "reason": "not now"},'
            b' {"type": "mcp_approval_response", "approval_request_id": "tw-ap-2", "approve": true}]}'
        )
    )
    assert turn.approvals == [
        ApprovalAnswer("tw-ap-1", False, "not now", "input[0]"),
        ApprovalAnswer("tw-ap-2", True, "", "input[1]"),
    ]
    assert not turn.messages and not turn.results
    assert turn.params["approvals[1]"] == "input[1]"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"input": [{"type": "mcp_approval_response", "approve": true}]}', "input[0].approval_request_id"),
        (b'{"input": [{"type": "mcp_approval_response", "approval_request_id": "a"}]}', "input[0].approve"),
        (
            b'{"input": [{"type": "mcp_approval_response", "approval_request_id": "a", "approve": true},'
            b' {"role": "user", "content": "x"}]}',
            "input",
        ),
    ],
)
def test_a_bad_approval_answer_names_its_param(body: bytes, param: str) -> None:
    with pytest.raises(RequestProblem) as refused:
        turn_input(parse_request(body))
    assert refused.value.param == param


def test_a_continuation_shows_each_answered_call_with_its_arguments_and_approval() -> None:
    """A continuation announces each call an earlier response asked approval for
    (``ToolInputAvailable`` with its ``approval_id``) before its result: the ``mcp_call`` carries
    the call's ``arguments`` and ``approval_request_id``, as OpenAI's does, run or denied; one cut
    off before its result is an ``incomplete`` ``mcp_call``, never a client's ``function_call``.
    Before, the arguments were ``"{}"`` and no ``approval_request_id`` was set."""

    def answered(call_id: str, approval_id: str) -> dict[str, Any]:
        return {
            "tool_input_available": {
                "tool_call_id": call_id,
                "tool_name": "get_weather",
                "input_json": f'{{"city":"{call_id}"}}',
                "approval_id": approval_id,
            }
        }

    events, log = translate(
        [
            {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
            answered("c1", "tw-ap-1"),
            {"tool_output_available": {"tool_call_id": "c1", "tool_name": "get_weather", "output_json": "1"}},
            answered("c2", "tw-ap-2"),
            {"tool_output_denied": {"tool_call_id": "c2", "tool_name": "get_weather", "reason": "no"}},
            answered("c3", "tw-ap-3"),
            {"turn_end": {"status": "TURN_STATUS_ABORTED"}},
        ]
    )
    for event in events:
        EVENT.validate_python(event)
    response = Response.model_validate(log.snapshot())
    calls = [McpCall.model_validate(item.model_dump()) for item in response.output]
    assert [(c.approval_request_id, c.arguments, c.status) for c in calls] == [
        ("tw-ap-1", '{"city":"c1"}', "completed"),
        ("tw-ap-2", '{"city":"c2"}', "failed"),
        ("tw-ap-3", '{"city":"c3"}', "incomplete"),
    ]
    plain, _ = translate(TOOL_TURN)
    ran = next(e["item"] for e in plain if e.get("item", {}).get("type") == "mcp_call")
    assert ran["approval_request_id"] is None, "a call that asked no approval answers none"


def test_an_item_reference_to_an_approval_request_names_the_response_that_asked_it() -> None:
    """An approval id names the turn that asked it (``tw-ap-<hex>.<request id>``), so an
    ``item_reference`` to an ``mcp_approval_request`` continues that response, as a reference to
    any other item of it does; an approval id that names no turn (an older sidecar's) infers
    nothing."""
    asked = new_approval_id("tenant-a/resp-a")
    assert asked.startswith("tw-ap-") and approval_turn(asked) == "resp-a"
    assert approval_turn(new_approval_id("r" * 100)) is None, "too long to name it: not named"
    body = orjson.dumps(
        {
            "input": [
                {"role": "user", "content": "Weather?"},
                {"type": "item_reference", "id": asked},
                {"type": "mcp_approval_response", "approval_request_id": asked, "approve": True},
            ]
        }
    )
    assert referenced_response(parse_request(body)) == ("resp-a", 2)
    assert turn_input(parse_request(body), 2).approvals == [ApprovalAnswer(asked, True, "", "input[2]")]
    older = body.replace(asked.encode(), b"tw-ap-" + b"0" * 32)
    assert referenced_response(parse_request(older)) is None
