"""The doors name the model each step ran on (``StepStart.model`` / ``StepFinish.model``), a
fallback's included: the OpenAI Responses and Chat Completions doors' ``model`` (the model that
answered, as OpenAI names it), AG-UI's per-model ``RUN_FINISHED.usage``.

A fresh-user trial: while the primary's breaker was open a step ran on the fallback with no
``AttemptStart``, and the doors named the primary (the turn's model) for the fallback's answer.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from support.event_logs import turn_events

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.http.ag_ui_events import RunLog
from turnwire_server.http.openai_chat import _Completion
from turnwire_server.http.openai_response_log import ResponseLog, stored_events, stored_log

PRIMARY = "anthropic:claude-sonnet-4-5"
FALLBACK = "openai:gpt-4o"

# Step 0 on the fallback (the primary's breaker open: no AttemptStart), step 1 on the primary.
BREAKER_THEN_PRIMARY: list[dict[str, Any]] = [
    {"turn_start": {"message_id": "m1", "model": PRIMARY}},
    {"step_start": {"step_number": 0, "model": FALLBACK}},
    {"step_finish": {"step_number": 0, "model": FALLBACK, "usage": {"input_tokens": 10, "output_tokens": 1}}},
    {"step_start": {"step_number": 1, "model": PRIMARY}},
    {"text_start": {"id": "t"}},
    {"text_delta": {"id": "t", "delta": "Hi."}},
    {"text_end": {"id": "t"}},
    {
        "step_finish": {
            "step_number": 1,
            "model": PRIMARY,
            "finish_reason": "FINISH_REASON_STOP",
            "usage": {"input_tokens": 20, "output_tokens": 2},
        }
    },
    {
        "turn_end": {
            "status": "TURN_STATUS_COMPLETED",
            "usage": {"input_tokens": 30, "output_tokens": 3, "total_tokens": 33},
        }
    },
]

# One step, on the fallback because the primary's breaker is open.
BREAKER_ONLY: list[dict[str, Any]] = [
    BREAKER_THEN_PRIMARY[0],
    BREAKER_THEN_PRIMARY[1],
    *BREAKER_THEN_PRIMARY[4:7],
    {"step_finish": {"step_number": 0, "model": FALLBACK, "finish_reason": "FINISH_REASON_STOP"}},
    {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
]


def test_the_responses_door_names_the_model_that_answered() -> None:
    log = ResponseLog("r1")
    models = []
    for event in turn_events(BREAKER_ONLY):
        for shown in log.feed(event):
            if shown["type"] == "response.output_text.delta":
                models.append(log.response["model"])
    assert models == [FALLBACK]
    assert Response.model_validate(log.snapshot()).model == FALLBACK
    log = ResponseLog("r2")
    for event in turn_events(BREAKER_THEN_PRIMARY):
        log.feed(event)
    assert log.response["model"] == PRIMARY, "the last step's model"


def test_a_stored_response_names_the_model_its_last_step_ran_on() -> None:
    reply = message_pb2.Message(id="m1", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().step_start.model = FALLBACK
    reply.parts.add().text.text = "Hi."
    turn = chat_service_pb2.Turn(
        request_id="r1", conversation_id="c", status=event_pb2.TURN_STATUS_COMPLETED, model=PRIMARY
    )
    log = stored_log(turn, reply)
    for event in stored_events(turn, reply):
        log.feed(event)
    assert log.response["model"] == FALLBACK


def test_the_chat_completions_door_names_the_model_of_each_step() -> None:
    completion = _Completion("chatcmpl-1", "", set())
    chunks = [chunk for event in turn_events(BREAKER_ONLY) for chunk in completion.feed(event)]
    content = [c["model"] for c in chunks if c["choices"][0]["delta"].get("content")]
    assert content == [FALLBACK]
    assert ChatCompletion.model_validate(completion.whole()).model == FALLBACK


def test_ag_ui_usage_names_the_model_a_step_ran_on_with_the_breaker_open() -> None:
    log = RunLog("t1", "r1")
    out = [shown for event in turn_events(BREAKER_THEN_PRIMARY, "t1") for shown in log.feed(event)]
    usage = out[-1]["usage"]
    assert [(u["model"], u["inputTokens"], u["outputTokens"]) for u in usage] == [
        (FALLBACK, 10, 1),
        (PRIMARY, 20, 2),
    ]
