"""The client's plain views of protobuf messages and errors (no server needed)."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from turnwire_client import ChatMessage, ToolCall, TurnwireError
from turnwire_client.result import collect_sync
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

BIG = 2**64 + 1


def _text(text: str) -> message_pb2.Part:
    return message_pb2.Part(text=message_pb2.TextPart(text=text))


STEP = message_pb2.Part(step_start=message_pb2.StepStartPart())


def test_a_tool_call_reads_the_exact_json_texts() -> None:
    part = message_pb2.ToolCallPart(
        tool_call_id="c1",
        tool_name="lookup",
        state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        input_json='{"n": 18446744073709551617, "x": 0.5, "ok": true, "none": null}',
        output_json="[1, 2.0, 18446744073709551617]",
        decision=message_pb2.TOOL_CALL_DECISION_SUBSTITUTED,
    )
    call = ToolCall.from_proto(part)
    assert call.input == {"n": BIG, "x": 0.5, "ok": True, "none": None}
    assert call.output == [1, 2.0, BIG] and type(call.output[1]) is float
    assert (call.state, call.decision, call.part) == ("output-available", "substituted", part)


def test_a_tool_call_without_json_texts_falls_back_to_the_struct_views() -> None:
    struct = struct_pb2.Struct()
    struct.update({"count": 3, "ratio": 0.25, "items": [1, 2]})
    part = message_pb2.ToolCallPart(
        tool_call_id="c1",
        tool_name="t",
        state=message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
        input=struct,
        error_text="boom",
        raw_input="",
    )
    call = ToolCall.from_proto(part)
    assert call.input == {"count": 3, "ratio": 0.25, "items": [1, 2]}
    assert type(call.input["count"]) is int
    assert (call.output, call.state, call.error_text) == (None, "output-error", "boom")


def test_an_input_that_was_not_json_is_none_with_its_raw_text() -> None:
    call = ToolCall.from_proto(
        message_pb2.ToolCallPart(tool_call_id="c", tool_name="t", raw_input="{not json", error_text="bad")
    )
    assert (call.input, call.raw_input, call.state) == (None, "{not json", "")


def test_approval_answers() -> None:
    requested = message_pb2.ToolCallPart(
        state=message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED, approval=message_pb2.ToolCallApproval(id="a1")
    )
    denied = message_pb2.ToolCallPart(
        state=message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
        approval=message_pb2.ToolCallApproval(id="a2", approved=False, reason="no"),
    )
    assert (ToolCall.from_proto(requested).approval_id, ToolCall.from_proto(requested).approved) == (
        "a1",
        None,
    )
    assert (ToolCall.from_proto(denied).state, ToolCall.from_proto(denied).approved) == (
        "output-denied",
        False,
    )


def test_a_message_in_steps() -> None:
    call = message_pb2.ToolCallPart(tool_call_id="c1", tool_name="t", input_json="{}", output_json="1")
    metadata = struct_pb2.Struct()
    metadata.update({"source": "web", "n": 2})
    message = message_pb2.Message(
        id="m1",
        role=message_pb2.ROLE_ASSISTANT,
        parts=[
            STEP,
            message_pb2.Part(reasoning=message_pb2.ReasoningPart(text="think")),
            _text("Let me look. "),
            message_pb2.Part(tool_call=call),
            STEP,
            STEP,  # a step cut short before any part: no step
            _text("Found "),
            _text("it."),
        ],
        metadata=metadata,
        create_time=timestamp_pb2.Timestamp(seconds=1_700_000_000),
    )
    plain = ChatMessage.from_proto(message)
    assert [(s.text, s.reasoning, len(s.tool_calls)) for s in plain.steps] == [
        ("Let me look. ", "think", 1),
        ("Found it.", "", 0),
    ]
    assert plain.text == "Let me look.\n\nFound it."
    assert [c.output for c in plain.tool_calls] == [1]
    assert (plain.id, plain.role, plain.metadata) == ("m1", "assistant", {"source": "web", "n": 2})
    assert plain.create_time == datetime.fromtimestamp(1_700_000_000, UTC)


def test_a_user_message_is_one_step() -> None:
    plain = ChatMessage.from_proto(message_pb2.Message(role=message_pb2.ROLE_USER, parts=[_text("hi")]))
    assert (plain.role, plain.text, len(plain.steps), plain.create_time) == ("user", "hi", 1, None)
    assert ChatMessage.from_proto(message_pb2.Message()).steps == []


def test_an_error_reads_error_info_bad_request_and_retry_info() -> None:
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="slow down")
    status.details.add().Pack(
        error_details_pb2.ErrorInfo(reason="RATE_LIMITED", domain="turnwire.dev", metadata={"limit": "turns"})
    )
    status.details.add().Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="model", description="unknown")
            ]
        )
    )
    status.details.add().Pack(
        error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2, nanos=500_000_000))
    )
    error = TurnwireError.from_status(status)
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (error.reason, error.domain, error.error_metadata) == (
        "RATE_LIMITED",
        "turnwire.dev",
        {"limit": "turns"},
    )
    assert error.field_violations == [("model", "unknown")]
    assert error.retry_delay == 2.5
    assert str(error) == "RESOURCE_EXHAUSTED [RATE_LIMITED]: slow down; model: unknown"


def test_unknown_options_and_values_are_refused_before_sending() -> None:
    from turnwire_client._requests import with_turn_options

    with pytest.raises(TypeError, match="unknown option"):
        with_turn_options(chat_service_pb2.ChatRequest(), {"modle": "x"})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(ValueError, match="disconnect must be one of"):
        with_turn_options(chat_service_pb2.ChatRequest(), {"disconnect": "later"})  # type: ignore[typeddict-item]


def test_a_step_holds_its_sources_with_the_text_they_support_and_its_files() -> None:
    """Issue 31: a source's cited passage, location and the text part that cites it (by
    ``TextPart.id``); a file's bytes, provider id, or only its size when its bytes were not kept."""
    message = message_pb2.Message(id="a1", role=message_pb2.ROLE_ASSISTANT)
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.CopyFrom(message_pb2.TextPart(text="Plain. ", id=""))
    message.parts.add().text.CopyFrom(message_pb2.TextPart(text="330 m tall", id="s0-3"))
    message.parts.add().source.CopyFrom(
        message_pb2.SourcePart(
            source_id="s0-src1",
            url="https://example.com/t",
            title="Tower",
            cited_text="It is 330 metres tall.",
            text_id="s0-3",
            source_type=message_pb2.SOURCE_TYPE_URL,
        )
    )
    message.parts.add().source.CopyFrom(
        message_pb2.SourcePart(
            source_id="s0-src2",
            filename="report.pdf",
            source_type=message_pb2.SOURCE_TYPE_DOCUMENT,
            location=message_pb2.SourceLocation(unit=message_pb2.SOURCE_LOCATION_UNIT_PAGE, start=3, end=4),
        )
    )
    message.parts.add().file.CopyFrom(message_pb2.FilePart(media_type="image/png", data=b"png"))
    message.parts.add().file.CopyFrom(message_pb2.FilePart(media_type="image/png", size_bytes=5_000_000))
    (step,) = ChatMessage.from_proto(message).steps
    first, second = step.sources
    assert (first.url, first.title, first.cited_text, first.text, first.kind) == (
        "https://example.com/t",
        "Tower",
        "It is 330 metres tall.",
        "330 m tall",
        "url",
    )
    assert (second.kind, second.title, second.text) == ("document", "report.pdf", "")
    assert second.location == {"unit": "page", "document_index": 0, "start": 3, "end": 4}
    kept, dropped = step.files
    assert (kept.data, kept.size_bytes) == (b"png", 3)
    assert (dropped.data, dropped.url, dropped.provider_file_id, dropped.size_bytes) == (
        b"",
        "",
        "",
        5_000_000,
    )


def test_a_results_cost_and_error_reason() -> None:
    """``TurnResult.cost_usd`` is ``TurnEnd.cost.usd``, None when unset (an unknown cost, never
    0); ``error_reason`` is the ErrorInfo reason of ``TurnEnd.error``, "" without one
    (fresh-user trial: neither was reachable without the raw protos)."""
    start = event_pb2.TurnEvent(conversation_id="c", request_id="r", sequence_number=1)
    start.turn_start.message_id = "m"
    priced = event_pb2.TurnEvent(conversation_id="c", request_id="r", sequence_number=2)
    priced.turn_end.status = event_pb2.TURN_STATUS_COMPLETED
    priced.turn_end.cost.usd = 0.00042
    result = collect_sync([start, priced])
    assert result.cost_usd == 0.00042 and result.error_reason == ""

    failed = event_pb2.TurnEvent(conversation_id="c", request_id="r", sequence_number=2)
    failed.turn_end.status = event_pb2.TURN_STATUS_ERROR
    failed.turn_end.error.code = code_pb2.RESOURCE_EXHAUSTED
    failed.turn_end.error.message = "the turn budget has no room for another model step"
    failed.turn_end.error.details.add().Pack(
        error_details_pb2.ErrorInfo(reason="BUDGET_EXHAUSTED", domain="turnwire.dev")
    )
    result = collect_sync([start, failed])
    assert result.cost_usd is None  # unknown, not $0
    assert result.error_reason == "BUDGET_EXHAUSTED"


def test_an_error_states_a_violation_its_message_already_holds_once() -> None:
    # The sidecar's own UNKNOWN_MODEL and taken-request-id statuses: the message holds the field and
    # the description in its own words; the string repeated the whole description after it.
    said = "model 'nope:x' names provider 'nope', which is not configured; configured: ['scripted']"
    error = TurnwireError(
        grpc.StatusCode.INVALID_ARGUMENT,
        said,
        reason="UNKNOWN_MODEL",
        field_violations=[("model", said)],
    )
    assert str(error) == f"INVALID_ARGUMENT [UNKNOWN_MODEL]: {said}"
    taken = "it ended aborted; retry it under this request_id with the same messages"
    error = TurnwireError(
        grpc.StatusCode.ALREADY_EXISTS,
        f"a turn with request_id 'r1' already exists: {taken}",
        reason="INVALID_FIELD",
        field_violations=[("request_id", taken)],
    )
    assert str(error).count(taken) == 1
    # A description the message holds without naming the field is still added, with its field.
    error = TurnwireError(
        grpc.StatusCode.INVALID_ARGUMENT, "unknown", field_violations=[("model", "unknown")]
    )
    assert str(error) == "INVALID_ARGUMENT: unknown; model: unknown"
