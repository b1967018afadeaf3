"""A turn's events read as AG-UI events (server/turnwire_server/http/ag_ui_events.py,
docs/api/ag-ui.md#events), in process: every event validates against AG-UI's own event models
(``ag-ui-protocol`` 1.0.0, the protocol version of the pinned ``@ag-ui/client``) with no field
they do not declare, the same log always gives the same events (a re-attached run is the run),
and each terminal status has its event. The body's mapping (ag_ui_request.py) and its refusals
name the field to fix; the ``Accept`` header decides the encoding as AG-UI's encoder does.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from ag_ui.core import Event, RunAgentInput
from pydantic import BaseModel, TypeAdapter
from support.event_logs import SERVER_TOOL_TURN, turn_events

from turnwire_client.v1 import message_pb2
from turnwire_server.http.ag_ui_door import accepts_sse
from turnwire_server.http.ag_ui_events import RunLog
from turnwire_server.http.ag_ui_request import parse_run_input, run_input
from turnwire_server.http.openai_request import RequestProblem

EVENT: TypeAdapter[Any] = TypeAdapter(Event)

CLIENT_TOOL_TURN: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
    {"step_start": {}},
    {"tool_input_available": {"tool_call_id": "c9", "tool_name": "get_location", "input_json": "{}"}},
    {"step_finish": {"finish_reason": "FINISH_REASON_TOOL_CALLS"}},
    {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
]


def translate(kinds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    log = RunLog("t1", "r1")
    out = [shown for event in turn_events(kinds, "t1") for shown in log.feed(event)]
    for shown in out:
        parsed = EVENT.validate_python(shown)
        undeclared = [name for name, model in _models(parsed) if model.model_extra]
        assert not undeclared, (shown, undeclared)
    return out


def _models(model: BaseModel, name: str = "") -> list[tuple[str, BaseModel]]:
    found = [(name or type(model).__name__, model)]
    for field, value in model:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                found += _models(item, field)
    return found


def test_a_server_tool_turn_reads_as_one_ag_ui_run() -> None:
    events = translate(SERVER_TOOL_TURN)
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "STEP_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert events[0] == {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}
    texts = [e["messageId"] for e in events if e["type"] == "TEXT_MESSAGE_START"]
    assert texts == ["tw-a-r1.1", "tw-a-r1.2"]  # the reply id, then the run's block count
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert result == {
        "type": "TOOL_CALL_RESULT",
        "messageId": "tw-result-c1",
        "toolCallId": "c1",
        "content": '{"result":42}',
        "role": "tool",
    }
    assert [e["stepName"] for e in events if e["type"] == "STEP_STARTED"] == ["step-0", "step-1"]
    finished = events[-1]
    assert finished["outcome"] == {"type": "success"}
    assert finished["usage"] == [
        {
            "provider": "scripted",
            "model": "scripted:x",
            "inputTokens": 10,
            "outputTokens": 6,
            "totalTokens": 16,
            "reasoningTokens": 0,
            "cachedInputTokens": 0,
            "cacheWriteInputTokens": 0,
        }
    ]


def test_the_same_log_gives_the_same_run() -> None:
    assert translate(SERVER_TOOL_TURN) == translate(SERVER_TOOL_TURN)


def test_a_client_tool_call_is_left_pending() -> None:
    events = translate(CLIENT_TOOL_TURN)
    assert [e["type"] for e in events][2:5] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c9"]}


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        (
            {"status": "TURN_STATUS_ERROR", "error": {"code": 14, "message": "the model is down"}},
            {"type": "RUN_ERROR", "message": "the model is down", "code": "server_error"},
        ),
        (
            {"status": "TURN_STATUS_ERROR", "error": {"code": 8, "message": "slow down"}},
            {"type": "RUN_ERROR", "message": "slow down", "code": "rate_limit_exceeded"},
        ),
        ({"status": "TURN_STATUS_ABORTED"}, {"type": "RUN_FINISHED", "outcome": {"type": "cancelled"}}),
    ],
)
def test_each_end_has_its_event(end: dict[str, Any], expected: dict[str, Any]) -> None:
    kinds = [
        SERVER_TOOL_TURN[0],
        SERVER_TOOL_TURN[1],
        SERVER_TOOL_TURN[5],
        SERVER_TOOL_TURN[6],
        {"turn_end": end},
    ]
    events = translate(kinds)
    # what was open is closed before the run ends
    assert [e["type"] for e in events][-3:-1] == ["TEXT_MESSAGE_END", "STEP_FINISHED"]
    assert {k: v for k, v in events[-1].items() if k in expected} == expected


def test_a_turn_that_never_started_still_opens_its_run() -> None:
    events = translate([{"turn_end": {"status": "TURN_STATUS_SKIPPED"}}])
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_FINISHED"]


# -- the request body ------------------------------------------------------------------------------


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    value = {"threadId": "t1", "runId": "r1", "messages": messages, "tools": [], "context": [], **fields}
    RunAgentInput.model_validate(value)  # a body AG-UI itself takes
    return value


def read(value: dict[str, Any]) -> Any:
    return run_input(parse_run_input(orjson.dumps(value)))


def test_the_last_user_message_is_the_input() -> None:
    turn = read(
        body(
            [
                {"id": "u0", "role": "user", "content": "earlier"},
                {"id": "a0", "role": "assistant", "content": "stored already"},
                {
                    "id": "u1",
                    "role": "user",
                    "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "6*7?"}],
                },
            ],
            tools=[{"name": "get_location", "description": "where", "parameters": {"type": "object"}}],
            forwardedProps={"model": "scripted:echo", "x": 1},
            context=[{"description": "tz", "value": "UTC"}],
            state={"k": [1]},
        )
    )
    assert turn.results == []
    assert turn.message.id == "u1" and turn.message.role == message_pb2.ROLE_USER
    assert turn.message.parts[0].text.text == "What is 6*7?"
    assert [tool.name for tool in turn.client_tools] == ["get_location"]
    assert turn.model == "scripted:echo"
    assert turn.body == {
        "context": [{"description": "tz", "value": "UTC"}],
        "state": {"k": [1]},
        "forwardedProps": {"model": "scripted:echo", "x": 1},
    }


def test_trailing_tool_messages_answer_pending_calls() -> None:
    turn = read(
        body(
            [
                {"id": "u1", "role": "user", "content": "Where am I?"},
                {
                    "id": "a1",
                    "role": "assistant",
                    "toolCalls": [
                        {
                            "id": "c0",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": "{}"},
                        },
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_location", "arguments": "{}"},
                        },
                        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                    ],
                },
                {"id": "tw-result-c0", "role": "tool", "toolCallId": "c0", "content": "42"},
                {"id": "m1", "role": "tool", "toolCallId": "c1", "content": '{"city": "Paris"}'},
                {"id": "m2", "role": "tool", "toolCallId": "c2", "content": "noon", "error": "no clock"},
            ]
        )
    )
    assert turn.message is None
    assert [(r.tool_call_id, r.output_json, r.error, r.error_text) for r in turn.results] == [
        ("c1", '{"city": "Paris"}', False, ""),
        ("c2", "", True, "no clock"),
    ]


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        ({"runId": "r1", "messages": []}, "threadId", "threadId: Field required"),
        ({"threadId": "t", "runId": "r", "messages": []}, "messages", "the last message must be the user's"),
        (
            {"threadId": "t", "runId": "r", "messages": [{"id": "a", "role": "assistant", "content": "x"}]},
            "messages",
            "got 'assistant'",
        ),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "u", "role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            "messages.0.content[0]",
            "only text parts",
        ),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "u", "role": "user", "content": "x"}],
                "forwardedProps": {"model": 3},
            },
            "forwardedProps.model",
            "a model id as a string",
        ),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "u", "role": "user", "content": "x"}],
                "resume": [{"interruptId": "i", "status": "resolved"}],
            },
            "resume",
            "no interrupts",
        ),
    ],
)
def test_a_body_in_the_wrong_shape_names_the_field(value: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(RequestProblem) as refused:
        read(value)
    assert refused.value.param == field
    assert says in refused.value.message


@pytest.mark.parametrize(
    ("accept", "sse"),
    [
        (None, True),
        ("text/event-stream", True),
        ("*/*", True),
        ("application/vnd.ag-ui.event+proto, text/event-stream;q=0.5", True),
        ("application/vnd.ag-ui.event+proto", False),
        ("application/json", False),
        ("text/event-stream;q=0", False),
    ],
)
def test_the_accept_header_picks_sse(accept: str | None, sse: bool) -> None:
    assert accepts_sse(accept) is sse


def test_a_restarted_attempt_ends_what_the_earlier_one_left_open() -> None:
    """A step a provider fallback restarts after output (or a recovery): AG-UI's clients refuse a
    run that finishes with a message or a call still open (``HttpAgent``: "Cannot send
    'RUN_FINISHED' while text messages are still active", developer trial). The earlier attempt's
    message, reasoning and call are ended at the ``AttemptStart``; its call is not pending."""
    events = translate(
        [
            {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
            {"step_start": {}},
            {"reasoning_start": {"id": "s0-r"}},
            {"reasoning_delta": {"id": "s0-r", "delta": "hm"}},
            {"text_start": {"id": "s0-t"}},
            {"text_delta": {"id": "s0-t", "delta": "Partial "}},
            {"tool_input_start": {"tool_call_id": "c1", "tool_name": "get_location"}},
            {"attempt_start": {"attempt": 2, "reason": "SERVER_RESTARTED", "appends": True}},
            {"step_start": {}},
            {"text_start": {"id": "s0-t"}},
            {"text_delta": {"id": "s0-t", "delta": "Whole."}},
            {"text_end": {"id": "s0-t"}},
            {"step_finish": {"finish_reason": "FINISH_REASON_STOP"}},
            {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
        ]
    )
    started = [
        e["type"]
        for e in events[
            events.index({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "get_location"})
            + 1 :
        ]
    ]
    assert started[:6] == [
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_END",
        "STEP_FINISHED",
        "STEP_STARTED",
    ]
    open_messages: set[str] = set()
    for event in events:  # every message ends before the run does, and no id is started twice
        if event["type"] in ("TEXT_MESSAGE_START", "REASONING_MESSAGE_START"):
            assert event["messageId"] not in open_messages
            open_messages.add(event["messageId"])
        elif event["type"] in ("TEXT_MESSAGE_END", "REASONING_MESSAGE_END"):
            open_messages.remove(event["messageId"])
    assert not open_messages
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}


def test_a_call_an_earlier_attempt_dropped_opens_again_when_the_new_one_makes_it() -> None:
    """A model that numbers its calls (the scripted one) streams the same call id on the new
    attempt: it opens again, with its arguments, and is pending when nobody ran it."""
    events = translate(
        [
            {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
            {"step_start": {}},
            {"tool_input_start": {"tool_call_id": "c1", "tool_name": "get_location"}},
            {"attempt_start": {"attempt": 2, "reason": "STREAM_STALLED", "appends": True}},
            {"step_start": {}},
            {"tool_input_start": {"tool_call_id": "c1", "tool_name": "get_location"}},
            {"tool_input_delta": {"tool_call_id": "c1", "input_text_delta": "{}"}},
            {"tool_input_available": {"tool_call_id": "c1", "tool_name": "get_location", "input_json": "{}"}},
            {"step_finish": {"finish_reason": "FINISH_REASON_TOOL_CALLS"}},
            {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
        ]
    )
    calls = [(e["type"], e.get("toolCallId")) for e in events if e["type"].startswith("TOOL_CALL")]
    assert calls == [
        ("TOOL_CALL_START", "c1"),
        ("TOOL_CALL_END", "c1"),
        ("TOOL_CALL_START", "c1"),
        ("TOOL_CALL_ARGS", "c1"),
        ("TOOL_CALL_END", "c1"),
    ]
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c1"]}


def test_after_a_provider_fallback_usage_has_an_entry_per_model_adding_up_to_the_turn_s() -> None:
    """Stop 66's noticed list: ``RUN_FINISHED.usage`` named the turn's first model for the whole
    turn's usage after a fallback had moved its steps to another provider's model."""
    events = translate(
        [
            {"turn_start": {"message_id": "tw-a-r1", "model": "anthropic:claude"}},
            {"step_start": {}},
            {"step_finish": {"finish_reason": "FINISH_REASON_TOOL_CALLS", "usage": {"input_tokens": 10}}},
            {"attempt_start": {"attempt": 2, "reason": "PROVIDER_FALLBACK", "model": "openai:gpt-4.1"}},
            {"step_start": {}},
            {
                "step_finish": {
                    "finish_reason": "FINISH_REASON_STOP",
                    "usage": {"input_tokens": 7, "output_tokens": 3},
                }
            },
            {
                "turn_end": {
                    "status": "TURN_STATUS_COMPLETED",
                    "usage": {"input_tokens": 20, "output_tokens": 3, "total_tokens": 23},
                }
            },
        ]
    )
    usage = events[-1]["usage"]
    assert [(u["provider"], u["model"]) for u in usage] == [
        ("anthropic", "anthropic:claude"),
        ("openai", "openai:gpt-4.1"),
    ]
    assert [u["inputTokens"] for u in usage] == [10, 10]  # a compaction's 3 on the last model
    assert [u["outputTokens"] for u in usage] == [0, 3]
    assert sum(u["totalTokens"] for u in usage) == 23


def test_without_a_fallback_usage_is_the_turn_s_under_its_model() -> None:
    events = translate(
        [
            {"turn_start": {"message_id": "tw-a-r1", "model": "scripted:x"}},
            {"step_start": {}},
            {"step_finish": {"finish_reason": "FINISH_REASON_STOP", "usage": {"input_tokens": 4}}},
            {
                "turn_end": {
                    "status": "TURN_STATUS_COMPLETED",
                    "usage": {"input_tokens": 9, "output_tokens": 1},
                }
            },
        ]
    )
    (usage,) = events[-1]["usage"]
    assert (usage["model"], usage["inputTokens"], usage["totalTokens"]) == ("scripted:x", 9, 10)
