"""``DetachedResults.reconcile`` on a real store (docs/subagents.md, "Detached sub-agents"): what a
crash between a detached child's end and its answer's submission leaves, a child ended in the
store without its submission, is submitted once from the stored end; other sub-agents' children,
children of a deleted parent and delivered answers are left alone; and the answer built from the
store is byte for byte the one the child's own end submits, so the two are one submission
whichever comes first. The crash itself, in a real process, is
tests/e2e/test_detached_subagents_e2e.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from google.rpc import status_pb2
from support.store_turns import crashed_turn

from turnwire.subagents import SubagentCall
from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.engine.detached_subagents import DetachedResults, result_submission_id
from turnwire_server.store import TurnRecord
from turnwire_server.store.records import SubmissionRecord
from turnwire_server.store.sqlite import SqliteStore

EPOCH = dt.datetime.fromtimestamp(0, dt.UTC)


class StoringSubmissions:
    """Submissions that only store (the turns they would start are not this test's): the store's
    own idempotency decides what a repeat does."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def submit(self, record: SubmissionRecord) -> tuple[SubmissionRecord, bool]:
        return await self.store.create_submission(record, max_open=10)


def with_path(call: SubagentCall) -> Callable[[str], str]:
    """A spec edit that makes the turn ``call``'s child turn."""

    def edit(spec: str) -> str:
        value = json.loads(spec)
        value["subagent_path"] = [[call.tool_call_id, call.subagent, call.conversation_id, call.request_id]]
        return json.dumps(value)

    return edit


async def ended_child(
    store: SqliteStore, call: SubagentCall, *, answer: str | None = None, error: str | None = None
) -> TurnRecord:
    """``call``'s child turn ended in ``store``: completed with ``answer``, else errored with
    ``error``."""
    turn = await crashed_turn(
        store, call.conversation_id, call.request_id, model="scripted:x", edit_spec=with_path(call)
    )
    reply = None
    if answer is not None:
        reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
        reply.parts.add().text.text = answer
    status = None if error is None else status_pb2.Status(code=13, message=error)
    ended = dataclasses.replace(
        turn,
        state="completed" if answer is not None else "error",
        end_time=dt.datetime.now(dt.UTC),
        error=None if status is None else status.SerializeToString(),
    )
    await store.finish_turn(ended, reply, events=[(1, b"end")], stream_ended=True)
    return ended


def submitted_text(record: SubmissionRecord) -> str:
    request = chat_service_pb2.SubmitMessagesRequest.FromString(record.request)
    return "".join(p.text.text for m in request.messages for p in m.parts)


async def test_an_undelivered_answer_is_submitted_once_and_others_are_left_alone(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "turnwire.db")
    await store.open()
    try:
        await crashed_turn(store, "p", "r-parent", model="scripted:x")  # the parent conversation
        answered = SubagentCall("call_1", "background", "p:sub-1", "r-child-1")
        failed = SubagentCall("call_2", "background", "p:sub-2", "r-child-2")
        attached = SubagentCall("call_3", "helper", "p:sub-3", "r-child-3")
        orphan = SubagentCall("call_4", "background", "gone:sub-4", "r-child-4")
        await ended_child(store, answered, answer="The answer.")
        await ended_child(store, failed, error="the model failed")
        await ended_child(store, attached, answer="Not detached.")
        await ended_child(store, orphan, answer="Its parent is deleted.")
        results = DetachedResults()
        results.bind(StoringSubmissions(store), store)  # type: ignore[arg-type]

        assert await results.reconcile({"background"}, EPOCH) == 2
        first = await store.get_submission(result_submission_id("p:sub-1", "r-child-1"))
        second = await store.get_submission(result_submission_id("p:sub-2", "r-child-2"))
        assert first is not None and first.conversation_id == "p"
        assert submitted_text(first) == "Sub-agent background (call call_1) answered: The answer."
        assert second is not None
        assert submitted_text(second) == "Sub-agent background (call call_2) ended error: the model failed"
        assert await store.get_submission(result_submission_id("p:sub-3", "r-child-3")) is None
        assert await store.get_submission(result_submission_id("gone:sub-4", "r-child-4")) is None

        assert await results.reconcile({"background"}, EPOCH) == 0  # a second pass submits nothing
        assert await results.reconcile({"background"}, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)) == 0
    finally:
        await store.close()


async def test_the_answer_from_the_store_is_the_one_the_childs_end_submits(tmp_path: Path) -> None:
    """The same request bytes: the store takes the later of the two as a repeat, not a conflict."""
    store = SqliteStore(tmp_path / "turnwire.db")
    await store.open()
    try:
        await crashed_turn(store, "p", "r-parent", model="scripted:x")
        call = SubagentCall("call_1", "background", "p:sub-1", "r-child-1")
        turn = await ended_child(store, call, answer="The answer.")
        (reply,) = [m for m in await store.load_messages("p:sub-1") if m.id == turn.assistant_message_id]
        run: Any = SimpleNamespace(
            request=SimpleNamespace(subagent_path=(call,), principal=""),
            outcome="completed",
            status_error=None,
            stored_message=reply,
        )
        own = DetachedResults._record(SimpleNamespace(run=run), "background")  # type: ignore[arg-type]
        results = DetachedResults()
        results.bind(StoringSubmissions(store), store)  # type: ignore[arg-type]
        assert await results.reconcile({"background"}, EPOCH) == 1
        stored = await store.get_submission(own.submission_id)
        assert stored is not None and stored.request == own.request
        _, created = await store.create_submission(own, max_open=10)
        assert not created  # the child's own delivery, coming second, is the same submission
    finally:
        await store.close()
