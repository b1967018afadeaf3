"""A turn on the stored history as it is (SaveMessages with no messages) needs a history
(docs/semantics.md §1; issue 32 item 13): on an unknown or empty conversation it ends SKIPPED
with ``NOTHING_TO_CONTINUE``, as ContinueLastTurn does, with no model call and nothing stored,
so no conversation ever starts with an assistant message; on a question still waiting for its
answer it runs. The API's NOT_FOUND for an unknown conversation is
``tests/e2e/test_transcript_e2e.py``."""

from __future__ import annotations

import dataclasses
import datetime as dt

from google.rpc import error_details_pb2
from support.engine_harness import CONV, EngineFactory, detail, end_of, kinds

from turnwire.testing import ScriptedError, ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.store.records import TurnRecord


async def test_a_turn_on_the_history_of_an_empty_conversation_is_skipped(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="never sent")]})

    # No conversation at all (the API refuses it with NOT_FOUND first; a delete may race that).
    events = await h.run(None, conversation_id="nothing-here", skip_unless="history")
    end = end_of(events)
    assert kinds(events) == ["turn_end"]
    assert end.status == event_pb2.TURN_STATUS_SKIPPED
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "NOTHING_TO_CONTINUE"
    assert "the conversation has no messages" in end.error.message
    assert h.provider.calls == 0
    assert await h.store.get_conversation("nothing-here") is None  # nothing created

    # A conversation that exists with no messages (its only turn stored none).
    record = TurnRecord(
        request_id="r-empty",
        conversation_id="empty",
        assistant_message_id="tw-a-r-empty",
        continuation=False,
        model="scripted:main",
        state="running",
        start_time=dt.datetime.now(dt.UTC),
    )
    await h.store.start_turn(record, [])
    await h.store.finish_turn(
        dataclasses.replace(record, state="error", end_time=dt.datetime.now(dt.UTC)), None
    )
    assert await h.store.get_conversation("empty") is not None
    events = await h.run(None, conversation_id="empty", skip_unless="history")
    assert kinds(events) == ["turn_end"]
    assert end_of(events).status == event_pb2.TURN_STATUS_SKIPPED
    assert h.provider.calls == 0
    assert await h.store.load_messages("empty") == ()


async def test_a_turn_on_the_history_as_it_is_still_answers_a_waiting_question(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(
        scripts={
            "main": [ScriptStep(text="answered")],
            "fail": [ScriptStep(error=ScriptedError(message="down", status=503))],
        }
    )
    failed = await h.run("question?", model="scripted:fail")
    assert end_of(failed).status == event_pb2.TURN_STATUS_ERROR

    events = await h.run(None, skip_unless="history")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert [m.role for m in await h.store.load_messages(CONV)] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]
