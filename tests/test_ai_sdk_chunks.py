"""A turn's events read as the AI SDK's UI message stream chunks
(server/turnwire_server/http/ai_sdk_chunks.py, docs/api/ai-sdk.md#chunks), in process: the exact
chunks of a tool turn, each turn ending, a continuation's calls announced once, sources and files;
and the request body's mapping (ai_sdk_request.py): a user message, the answers in an assistant
message's last step, and refusals that say what to fix. The chunks' shapes against the ``ai``
package's own schema are checked end to end (tests/e2e/test_ai_sdk_door_e2e.py).
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from support.event_logs import RESTARTED_STEP, turn_events

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.http.ai_sdk_chunks import UIMessageStream
from turnwire_server.http.ai_sdk_request import parse_body, turn_input
from turnwire_server.http.openai_request import RequestProblem

TOOL_TURN: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
    {"step_start": {}},
    {"reasoning_start": {"id": "s0-r"}},
    {"reasoning_delta": {"id": "s0-r", "delta": "think"}},
    {"reasoning_end": {"id": "s0-r"}},
    {"text_start": {"id": "s0-t"}},
    {"text_delta": {"id": "s0-t", "delta": "Let me check."}},
    {"text_end": {"id": "s0-t"}},
    {"tool_input_start": {"tool_call_id": "c1", "tool_name": "calculator"}},
    {"tool_input_delta": {"tool_call_id": "c1", "input_text_delta": '{"expression":"6*7"}'}},
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
    {"progress": {"phase": "PROGRESS_PHASE_MODEL"}},  # a keepalive: no chunk
    {"step_start": {"step_number": 1}},
    {"text_start": {"id": "s1-t"}},
    {"text_delta": {"id": "s1-t", "delta": "42."}},
    {"text_end": {"id": "s1-t"}},
    {"step_finish": {"step_number": 1, "finish_reason": "FINISH_REASON_STOP"}},
    {"turn_end": {"status": "TURN_STATUS_COMPLETED", "metadata": {"cost": 2}}},
]


def chunks_of(kinds: list[dict[str, Any]], stream: UIMessageStream | None = None) -> list[dict[str, Any]]:
    stream = stream or UIMessageStream()
    return [chunk for event in turn_events(kinds) for chunk in stream.feed(event)]


def test_a_tool_turn_reads_as_ui_message_chunks() -> None:
    assert chunks_of(TOOL_TURN) == [
        {"type": "start", "messageId": "tw-a-r1"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "s0-r"},
        {"type": "reasoning-delta", "id": "s0-r", "delta": "think"},
        {"type": "reasoning-end", "id": "s0-r"},
        {"type": "text-start", "id": "s0-t"},
        {"type": "text-delta", "id": "s0-t", "delta": "Let me check."},
        {"type": "text-end", "id": "s0-t"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "calculator"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"expression":"6*7"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "calculator",
            "input": {"expression": "6*7"},
        },
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"result": 42}},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "s1-t"},
        {"type": "text-delta", "id": "s1-t", "delta": "42."},
        {"type": "text-end", "id": "s1-t"},
        {"type": "finish-step"},
        {"type": "message-metadata", "messageMetadata": {"cost": 2}},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_the_same_log_gives_the_same_chunks() -> None:
    assert chunks_of(TOOL_TURN) == chunks_of(TOOL_TURN)


CUT: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "tw-a-r1"}},
    {"step_start": {}},
    {"text_start": {"id": "t"}},
    {"text_delta": {"id": "t", "delta": "partial"}},
]


@pytest.mark.parametrize(
    ("end", "last"),
    [
        (
            {"status": "TURN_STATUS_ERROR", "error": {"code": 13, "message": "the model is down"}},
            {"type": "error", "errorText": "the model is down"},
        ),
        ({"status": "TURN_STATUS_INTERRUPTED"}, {"type": "error", "errorText": "the turn failed"}),
        (
            {"status": "TURN_STATUS_ABORTED", "error": {"code": 1, "message": "cancelled"}},
            {"type": "abort", "reason": "cancelled"},
        ),
        ({"status": "TURN_STATUS_ABORTED"}, {"type": "abort"}),
    ],
)
def test_a_cut_turn_closes_its_blocks_then_ends(end: dict[str, Any], last: dict[str, Any]) -> None:
    chunks = chunks_of([*CUT, {"turn_end": end}])
    assert chunks[-2:] == [{"type": "text-end", "id": "t"}, last]


def test_a_turn_that_never_started_is_still_opened() -> None:
    denied: dict[str, Any] = {
        "tool_output_denied": {"tool_call_id": "c9", "tool_name": "get_weather", "reason": "no"}
    }
    skipped = {"turn_end": {"status": "TURN_STATUS_SKIPPED"}}
    assert chunks_of([denied, skipped], UIMessageStream(message_id="ui-1", known_calls=["c9"])) == [
        {"type": "tool-output-denied", "toolCallId": "c9"},
        {"type": "start", "messageId": "ui-1"},
        {"type": "finish"},
    ]


def test_a_continuation_announces_the_calls_the_client_does_not_hold() -> None:
    """Read back from its start, a continuation's result of an earlier turn's call comes first
    with that call's ``tool-input-available`` (the AI SDK refuses an output for a call it lacks);
    a client continuing its own message holds the call already."""
    kinds: list[dict[str, Any]] = [
        {"turn_start": {"message_id": "tw-a-r2", "continuation": True}},
        {
            "tool_output_available": {
                "tool_call_id": "c1",
                "tool_name": "get_weather",
                "output_json": '"sunny"',
            }
        },
        {"tool_output_error": {"tool_call_id": "c2", "tool_name": "get_weather", "error_text": "down"}},
    ]
    assert chunks_of(kinds) == [
        {"type": "start", "messageId": "tw-a-r2"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "get_weather", "input": None},
        {"type": "tool-output-available", "toolCallId": "c1", "output": "sunny"},
        {"type": "tool-input-available", "toolCallId": "c2", "toolName": "get_weather", "input": None},
        {"type": "tool-output-error", "toolCallId": "c2", "errorText": "down"},
    ]
    held = chunks_of(kinds, UIMessageStream(message_id="ui-1", known_calls=["c1", "c2"]))
    assert [c["type"] for c in held] == ["start", "tool-output-available", "tool-output-error"]
    assert held[0] == {"type": "start", "messageId": "ui-1"}


def test_a_continuation_announces_an_approved_call_with_its_input_unless_the_client_holds_it() -> None:
    """The engine announces each call an earlier turn asked approval for (``ToolInputAvailable``
    with its ``approval_id``) before its result: a stream read back from its start (a resume, a
    page that does not hold the call) shows its input; a client continuing its own message is not
    told again. Before, a resumed stream announced it with ``input: null``."""
    kinds: list[dict[str, Any]] = [
        {"turn_start": {"message_id": "tw-a-r2", "continuation": True}},
        {
            "tool_input_available": {
                "tool_call_id": "c1",
                "tool_name": "get_weather",
                "input_json": '{"city":"Paris"}',
                "approval_id": "tw-ap-1",
            }
        },
        {
            "tool_output_available": {
                "tool_call_id": "c1",
                "tool_name": "get_weather",
                "output_json": '"sunny"',
            }
        },
    ]
    assert chunks_of(kinds)[1:] == [
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "get_weather",
            "input": {"city": "Paris"},
        },
        {"type": "tool-output-available", "toolCallId": "c1", "output": "sunny"},
    ]
    held = chunks_of(kinds, UIMessageStream(message_id="ui-1", known_calls=["c1"]))
    assert [c["type"] for c in held] == ["start", "tool-output-available"]


def test_approvals_and_provider_executed_calls() -> None:
    kinds: list[dict[str, Any]] = [
        {"tool_input_start": {"tool_call_id": "c1", "tool_name": "web_search", "provider_executed": True}},
        {
            "tool_input_available": {
                "tool_call_id": "c1",
                "tool_name": "web_search",
                "provider_executed": True,
            }
        },
        {
            "tool_output_available": {
                "tool_call_id": "c1",
                "output_json": "[]",
                "provider_executed": True,
                "preliminary": True,
            }
        },
        {
            "tool_input_error": {
                "tool_call_id": "c2",
                "tool_name": "nope",
                "raw_input": "{bad",
                "error_text": "not JSON",
            }
        },
        {"tool_input_available": {"tool_call_id": "c3", "tool_name": "get_weather", "input_json": "{}"}},
        {"tool_approval_request": {"tool_call_id": "c3", "approval_id": "a3", "tool_name": "get_weather"}},
    ]
    assert chunks_of(kinds) == [
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "web_search", "providerExecuted": True},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "web_search",
            "input": {},
            "providerExecuted": True,
        },
        {
            "type": "tool-output-available",
            "toolCallId": "c1",
            "output": [],
            "providerExecuted": True,
            "preliminary": True,
        },
        {
            "type": "tool-input-error",
            "toolCallId": "c2",
            "toolName": "nope",
            "input": "{bad",
            "errorText": "not JSON",
        },
        {"type": "tool-input-available", "toolCallId": "c3", "toolName": "get_weather", "input": {}},
        {"type": "tool-approval-request", "approvalId": "a3", "toolCallId": "c3"},
    ]


def test_sources_and_files() -> None:
    png = base64.b64encode(b"\x89PNG").decode()
    kinds: list[dict[str, Any]] = [
        {"source": {"source_id": "s1", "url": "https://example.com", "title": "Example"}},
        {
            "source": {
                "source_id": "s2",
                "source_type": "SOURCE_TYPE_DOCUMENT",
                "media_type": "application/pdf",
                "filename": "a.pdf",
            }
        },
        {"file": {"media_type": "image/png", "data": png}},
        {"file": {"media_type": "image/png", "url": "https://example.com/a.png"}},
        {"file": {"media_type": "image/png", "provider_file_id": "file-1"}},  # no URL: not sent
    ]
    assert chunks_of(kinds) == [
        {"type": "source-url", "sourceId": "s1", "url": "https://example.com", "title": "Example"},
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "a.pdf",
            "filename": "a.pdf",
        },
        {"type": "file", "url": f"data:image/png;base64,{png}", "mediaType": "image/png"},
        {"type": "file", "url": "https://example.com/a.png", "mediaType": "image/png"},
    ]


# -- the request body --------------------------------------------------------------------------


def request(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"id": "conv-1", "messages": messages, "trigger": "submit-message", **extra})


def test_the_last_user_message_is_the_input() -> None:
    png = base64.b64encode(b"\x89PNG").decode()
    body = request(
        [
            {"id": "old", "role": "user", "parts": [{"type": "text", "text": "ignored: stored already"}]},
            {
                "id": "u2",
                "role": "user",
                "metadata": {"from": "web"},
                "parts": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "file", "mediaType": "image/png", "url": f"data:image/png;base64,{png}"},
                    {
                        "type": "file",
                        "mediaType": "image/png",
                        "url": "https://example.com/a.png",
                        "filename": "a.png",
                    },
                ],
            },
        ],
        model="scripted:echo",
        tools={"get_location": {"description": "where", "inputSchema": {"type": "object"}}},
        disconnectPolicy="continue",
        tenantHint="x",
    )
    turn = turn_input(parse_body(body))
    assert turn.message is not None and turn.message.id == "u2"
    assert [p.WhichOneof("kind") for p in turn.message.parts] == ["text", "file", "file"]
    assert turn.message.parts[1].file.data == b"\x89PNG" and turn.message.parts[2].file.url.startswith(
        "https:"
    )
    assert dict(turn.message.metadata) == {"from": "web"}
    assert turn.common["model"] == "scripted:echo" and turn.common["conversation_id"] == "conv-1"
    assert [t.name for t in turn.common["client_tools"]] == ["get_location"]
    assert turn.common["disconnect_policy"] == chat_service_pb2.DISCONNECT_POLICY_CONTINUE
    assert turn.common["body"] == {"tenantHint": "x"}  # for hooks


def test_an_assistant_message_answers_its_last_step() -> None:
    parts = [
        {"type": "step-start"},
        {"type": "tool-get_location", "toolCallId": "old", "state": "output-available", "output": 1},
        {"type": "step-start"},
        {"type": "tool-calculator", "toolCallId": "srv", "state": "output-available", "output": 42},
        {
            "type": "tool-get_location",
            "toolCallId": "c1",
            "state": "output-available",
            "output": {"city": "Paris"},
        },
        {
            "type": "dynamic-tool",
            "toolName": "get_location",
            "toolCallId": "c2",
            "state": "output-error",
            "errorText": "no GPS",
        },
        {
            "type": "tool-get_weather",
            "toolCallId": "c3",
            "state": "approval-responded",
            "approval": {"id": "a3", "approved": False, "reason": "not now"},
        },
    ]
    body = request([{"id": "tw-a-r1", "role": "assistant", "parts": parts}], tools={"get_location": {}})
    turn = turn_input(parse_body(body))
    assert turn.message is None and turn.continues == "tw-a-r1"
    assert turn.known_calls == ["old", "srv", "c1", "c2", "c3"]
    assert [(r.tool_call_id, r.output_json, r.error, r.error_text) for r in turn.results] == [
        ("c1", '{"city":"Paris"}', False, ""),
        ("c2", "", True, "no GPS"),
    ]
    assert [(a.tool_call_id, a.approved, a.reason) for a in turn.approvals] == [("c3", False, "not now")]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[]", "JSON object"),
        (b"{", "not JSON"),
        (orjson.dumps({"id": "c", "messages": []}), "messages"),
        (request([{"role": "assistant", "parts": []}], trigger="regenerate-message"), "cannot branch"),
        (
            request([{"role": "user", "parts": [{"type": "reasoning", "text": "x"}]}]),
            "messages[0].parts[0].type",
        ),
        (
            request([{"role": "user", "parts": [{"type": "file", "mediaType": "image/png"}]}]),
            "messages[0].parts[0].url",
        ),
        (request([{"role": "system", "parts": []}]), "messages[0].role"),
        (request([{"role": "assistant", "parts": [{"type": "text", "text": "hi"}]}]), "no new tool output"),
        (
            request(
                [
                    {
                        "role": "assistant",
                        "parts": [
                            {"type": "tool-get_location", "toolCallId": "c1", "state": "input-available"}
                        ],
                    }
                ],
                tools={"get_location": {}},
            ),
            "addToolOutput",
        ),
        (request([{"role": "user", "parts": []}], disconnectPolicy="later"), "disconnectPolicy"),
    ],
)
def test_refusals_say_what_to_fix(body: bytes, says: str) -> None:
    with pytest.raises(RequestProblem) as refused:
        turn_input(parse_body(body))
    assert says in str(refused.value)


def test_a_user_message_part_is_a_turnwire_part() -> None:
    turn = turn_input(
        parse_body(request([{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]))
    )
    assert turn.message == message_pb2.Message(
        id="u1", role=message_pb2.ROLE_USER, parts=[message_pb2.Part(text=message_pb2.TextPart(text="hi"))]
    )


def test_a_restarted_attempt_closes_what_the_earlier_one_left_open() -> None:
    """Before, the new attempt's ``start-step`` and ``text-start`` (the same block id) followed an
    open text part, which the page's message kept ``streaming`` for good (developer trial)."""
    assert chunks_of(RESTARTED_STEP) == [
        {"type": "start", "messageId": "tw-a-r1"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "s0-r"},
        {"type": "reasoning-delta", "id": "s0-r", "delta": "hm"},
        {"type": "text-start", "id": "s0-t"},
        {"type": "text-delta", "id": "s0-t", "delta": "Partial "},
        {"type": "reasoning-end", "id": "s0-r"},
        {"type": "text-end", "id": "s0-t"},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "s0-t"},
        {"type": "text-delta", "id": "s0-t", "delta": "Whole."},
        {"type": "text-end", "id": "s0-t"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_a_call_still_streaming_its_input_when_an_attempt_ends_is_closed_as_an_error() -> None:
    """A recovery's new attempt after a call's input began streaming: the part would stay
    ``input-streaming`` for good; it ends as a ``tool-input-error`` (the AI SDK's only end for it)."""
    chunks = chunks_of(
        [
            {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
            {"step_start": {}},
            {"tool_input_start": {"tool_call_id": "c1", "tool_name": "calculator"}},
            {"tool_input_delta": {"tool_call_id": "c1", "input_text_delta": '{"expr'}},
            {"attempt_start": {"attempt": 2, "reason": "STREAM_STALLED", "appends": True}},
            {"step_start": {}},
            {"step_finish": {"finish_reason": "FINISH_REASON_STOP"}},
            {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
        ]
    )
    at = chunks.index({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"expr'})
    error, finish_step = chunks[at + 1 : at + 3]
    assert error["type"] == "tool-input-error" and error["toolCallId"] == "c1" and error["input"] is None
    assert error["toolName"] == "calculator" and "new attempt" in error["errorText"]
    assert finish_step == {"type": "finish-step"}
    assert [c["type"] for c in chunks].count("tool-input-error") == 1
