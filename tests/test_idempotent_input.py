"""A message id is an idempotency key (docs/semantics.md §11 and §12).

Before: retrying a turn that failed with a retryable provider error was refused under the same
request id, and a new ``Chat`` stored the question twice (``[user, user, assistant]``, sent to
the model twice).
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from support.engine_harness import CONV, EngineFactory, collect, detail, end_of, kinds, text_of

from turnwire.testing import ScriptedError, ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2

SCRIPTS = {
    "main": [ScriptStep(text="The answer.")],
    "down": [ScriptStep(error=ScriptedError(message="overloaded", status=529, retryable=True))],
}


async def test_retrying_a_failed_turn_with_the_same_message_id_stores_the_question_once(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=SCRIPTS)
    failed = end_of(await h.run("what is it?", message_id="q1", request_id="r1", model="scripted:down"))
    assert failed.status == event_pb2.TURN_STATUS_ERROR
    # A new request with the same message: the question is not stored again, the turn answers it.
    retry = await h.run("what is it?", message_id="q1", request_id="r2")
    assert end_of(retry).status == event_pb2.TURN_STATUS_COMPLETED
    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored if m.role == message_pb2.ROLE_USER] == ["q1"]
    sent = h.provider.requests[-1].messages
    assert [m.id for m in sent if m.role == message_pb2.ROLE_USER] == ["q1"]  # asked once
    assert text_of(stored[-1]) == "The answer."


async def test_retrying_under_the_same_request_id_reruns_a_failed_turn(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={
            **SCRIPTS,
            "half": [
                ScriptStep(
                    text="Half an ans",
                    error=ScriptedError(message="gone", status=529, retryable=True, after_chunks=3),
                )
            ],
        }
    )
    failed = end_of(await h.run("hi", message_id="q1", request_id="r1", model="scripted:half"))
    assert failed.status == event_pb2.TURN_STATUS_ERROR and text_of(failed.message).startswith("Half")
    again = await h.run("hi", message_id="q1", request_id="r1")
    assert end_of(again).status == event_pb2.TURN_STATUS_COMPLETED
    assert kinds(again)[0] == "turn_start"
    # The retry answers the question (not a continuation of the failed partial) and replaces it.
    sent = h.provider.requests[-1].messages
    assert [m.id for m in sent] == ["q1"]
    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["q1", "tw-a-r1"]
    assert text_of(stored[-1]) == "The answer."


async def test_the_same_id_with_other_content_is_refused_before_anything_is_stored(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=SCRIPTS)
    await h.run("first", message_id="q1", request_id="r1", model="scripted:down")
    before = await h.store.load_messages(CONV)
    end = end_of(await h.run("something else", message_id="q1", request_id="r2"))
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert "with other content" in end.error.message
    assert await h.store.load_messages(CONV) == before


async def test_resending_an_answered_message_is_a_failed_precondition(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=SCRIPTS)
    assert (
        end_of(await h.run("hi", message_id="q1", request_id="r1")).status == event_pb2.TURN_STATUS_COMPLETED
    )
    before = await h.store.load_messages(CONV)
    end = end_of(await h.run("hi", message_id="q1", request_id="r2"))
    assert end.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "ALREADY_ANSWERED"
    assert await h.store.load_messages(CONV) == before
    # A completed turn's request id stays taken.
    end = end_of(await h.run("new", message_id="q2", request_id="r1"))
    assert end.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]


async def test_new_input_under_the_request_id_of_an_aborted_turn_is_refused(
    make_engine: EngineFactory,
) -> None:
    """A retry re-sends the same input; another question under an old request id would have
    replaced the stored partial reply and put the new answer before its question."""
    h = await make_engine(scripts={"main": [ScriptStep(text="first answer", delay_ms=30)]})
    handle = await h.start("first question", message_id="q1", request_id="req-a")

    def on_event(kind: str) -> None:
        if kind == "text_delta":
            handle.cancel()

    assert end_of(await collect(handle, on_event)).status == event_pb2.TURN_STATUS_ABORTED
    before = await h.store.load_messages(CONV)
    end = end_of(await h.run("second question", message_id="q2", request_id="req-a"))
    assert end.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert await h.store.load_messages(CONV) == before


async def test_the_refusal_of_a_taken_request_id_says_how_to_retry_without_a_duplicate(
    make_engine: EngineFactory,
) -> None:
    """Issue 32 item 12: the ALREADY_EXISTS text said "use a new request_id", and following it
    stored the question twice. It now points at the retry that does not."""
    h = await make_engine(scripts=SCRIPTS)
    failed = end_of(await h.run("q", message_id="q1", request_id="r1", model="scripted:down"))
    assert failed.status == event_pb2.TURN_STATUS_ERROR
    end = end_of(await h.run("q", message_id="q1-other", request_id="r1"))
    assert end.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert "retry it under this request_id with the same messages and message ids" in end.error.message
    (violation,) = detail(end.error, error_details_pb2.BadRequest).field_violations
    assert violation.field == "request_id" and "same messages and message ids" in violation.description
    # The retry it describes runs, and the question is stored once.
    assert (
        end_of(await h.run("q", message_id="q1", request_id="r1")).status == event_pb2.TURN_STATUS_COMPLETED
    )
    assert [m.role for m in await h.store.load_messages(CONV)] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]
    end = end_of(await h.run("q2", message_id="q2", request_id="r1"))
    assert "it completed and its reply is stored" in end.error.message
