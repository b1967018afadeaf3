"""The store's atomic answers to waiting tool calls (docs/semantics.md §6, §12), on every backend
(a real SQLite file, a real PostgreSQL database).

``answer_tool_calls`` is one atomic read-modify-write (SQLite: on the writer thread; PostgreSQL:
one transaction holding the conversation's rows ``FOR UPDATE``): of concurrent answers to one
assistant message, exactly one completes its batch (so exactly one continuation runs); refusals
store nothing. ``expire_pending_tool_calls`` closes waiting calls older than a cutoff, which the
maintenance loop calls periodically.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store
from turnwire_server.store.errors import (
    ToolCallExpired,
    ToolCallNotFound,
    ToolCallNotPending,
    ToolCallsSpanMessages,
)
from turnwire_server.store.records import ToolCallAnswer
from turnwire_server.store.waiting_calls import DENIED_BY_USER_TEXT

CONVERSATION = "conv-tools"
T0 = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC)


def _user(message_id: str, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


def _reply(message_id: str, *calls: tuple[str, str], created: dt.datetime = T0) -> message_pb2.Message:
    """An assistant message whose calls are ``(id, kind)``: kind ``client`` (a waiting client call),
    ``approval`` (an approval request) or ``done`` (a server call with a result)."""
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_ASSISTANT)
    message.create_time.FromDatetime(created)
    message.parts.add().step_start.SetInParent()
    for call_id, kind in calls:
        call = message.parts.add().tool_call
        call.tool_call_id = call_id
        call.tool_name = "get_location" if kind == "client" else "delete_file"
        call.input_json = "{}"
        if kind == "client":
            call.client_executed = True
            call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
        elif kind == "approval":
            call.state = message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED
            call.approval.id = f"ap-{call_id}"
        else:
            call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
            call.output_json = '"done"'
    return message


async def _store(store: Store, *messages: message_pb2.Message) -> None:
    for message in messages:
        await store.save_message(CONVERSATION, message)


def _calls(message: message_pb2.Message) -> dict[str, message_pb2.ToolCallPart]:
    return {
        p.tool_call.tool_call_id: p.tool_call for p in message.parts if p.WhichOneof("kind") == "tool_call"
    }


async def _stored_calls(store: Store) -> dict[str, message_pb2.ToolCallPart]:
    calls: dict[str, message_pb2.ToolCallPart] = {}
    for message in await store.load_messages(CONVERSATION):
        calls.update(_calls(message))
    return calls


async def test_concurrent_answers_complete_the_batch_exactly_once(store: Store) -> None:
    await _store(
        store,
        _user("u1", "where am I, and what is copied?"),
        _reply("a1", ("c1", "client"), ("c2", "client")),
    )
    answers = [
        ToolCallAnswer(call_id, "output", output_json=f'{{"n": {index}, "big": 12345678901234567890123}}')
        for index in range(20)
        for call_id in (("c1", "c2")[index % 2],)
    ]
    outcomes = await asyncio.gather(
        *(store.answer_tool_calls(CONVERSATION, [answer], expired_before=None) for answer in answers),
        return_exceptions=True,
    )
    accepted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(accepted) == 2, outcomes
    assert all(isinstance(error, ToolCallNotPending) for error in refused), refused
    assert sorted(o.completed for o in accepted) == [False, True], "exactly one answer completes the batch"
    first, last = sorted(accepted, key=lambda o: o.completed)
    assert len(first.waiting) == 1 and last.waiting == ()
    stored = await _stored_calls(store)
    for call in stored.values():
        assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        assert "12345678901234567890123" in call.output_json, "the output JSON is kept exactly"
    assert _calls(last.message) == stored


async def test_refused_answers_store_nothing(store: Store) -> None:
    await _store(
        store,
        _user("u1", "go"),
        _reply("a1", ("c1", "client"), ("p1", "approval"), ("s1", "done")),
        _reply("a2", ("c9", "client")),
    )
    before = await store.load_messages(CONVERSATION)
    refusals: list[tuple[list[ToolCallAnswer], type[Exception]]] = [
        ([ToolCallAnswer("nope", "output", output_json="1")], ToolCallNotFound),
        ([ToolCallAnswer("s1", "output", output_json="1")], ToolCallNotPending),
        ([ToolCallAnswer("p1", "output", output_json="1")], ToolCallNotPending),
        ([ToolCallAnswer("c1", "approve")], ToolCallNotPending),
        (
            [
                ToolCallAnswer("c1", "output", output_json="1"),
                ToolCallAnswer("c9", "output", output_json="1"),
            ],
            ToolCallsSpanMessages,
        ),
        (
            [ToolCallAnswer("c1", "output", output_json="1"), ToolCallAnswer("nope", "error")],
            ToolCallNotFound,
        ),
    ]
    for answers, expected in refusals:
        with pytest.raises(expected):
            await store.answer_tool_calls(CONVERSATION, answers, expired_before=None)
    assert await store.load_messages(CONVERSATION) == before


async def test_an_approval_id_given_as_the_call_id_says_to_answer_with_the_call_id(store: Store) -> None:
    """ToolApprovalRequest carries both ids; an answer names the call by ``tool_call_id``. Given
    the approval id instead, the refusal (nothing stored) says which call it belongs to."""
    await _store(store, _user("u1", "go"), _reply("a1", ("p1", "approval")))
    before = await store.load_messages(CONVERSATION)
    with pytest.raises(ToolCallNotFound) as refused:
        await store.answer_tool_calls(CONVERSATION, [ToolCallAnswer("ap-p1", "approve")], expired_before=None)
    assert str(refused.value) == (
        "conversation 'conv-tools' has no tool call 'ap-p1'; that is the approval id of call 'p1': "
        "answer with its tool_call_id"
    )
    assert refused.value.tool_call_id == "ap-p1"
    assert await store.load_messages(CONVERSATION) == before


async def test_answers_record_results_errors_approvals_and_denials(store: Store) -> None:
    await _store(
        store, _user("u1", "go"), _reply("a1", ("c1", "client"), ("p1", "approval"), ("p2", "approval"))
    )
    outcome = await store.answer_tool_calls(
        CONVERSATION,
        [ToolCallAnswer("c1", "error"), ToolCallAnswer("p1", "approve"), ToolCallAnswer("p2", "deny")],
        expired_before=None,
    )
    assert outcome.completed and outcome.waiting == ()
    calls = await _stored_calls(store)
    assert calls["c1"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert calls["c1"].error_text == DENIED_BY_USER_TEXT
    assert (
        calls["p1"].state == message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED and calls["p1"].approval.approved
    )
    assert calls["p2"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED
    assert calls["p2"].error_text == DENIED_BY_USER_TEXT and not calls["p2"].approval.approved


async def test_an_answer_after_a_later_user_message_or_the_expiry_is_refused(store: Store) -> None:
    await _store(store, _user("u1", "go"), _reply("a1", ("c1", "client")))
    with pytest.raises(ToolCallExpired):
        await store.answer_tool_calls(
            CONVERSATION,
            [ToolCallAnswer("c1", "output", output_json="1")],
            expired_before=T0 + dt.timedelta(seconds=1),
        )
    await _store(store, _user("u2", "never mind"))
    with pytest.raises(ToolCallNotPending, match="moved on"):
        await store.answer_tool_calls(
            CONVERSATION, [ToolCallAnswer("c1", "output", output_json="1")], expired_before=None
        )
    assert (await _stored_calls(store))["c1"].state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE


async def test_expire_pending_tool_calls_closes_only_old_waiting_calls(store: Store) -> None:
    old, recent = T0, T0 + dt.timedelta(hours=2)
    await _store(
        store,
        _user("u1", "go"),
        _reply("a1", ("c1", "client"), ("p1", "approval"), ("s1", "done"), created=old),
        _reply("a2", ("c2", "client"), created=recent),
    )
    assert await store.expire_pending_tool_calls(T0 + dt.timedelta(hours=1)) == 2
    calls = await _stored_calls(store)
    for call_id in ("c1", "p1"):
        assert calls[call_id].state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
        assert "expired" in calls[call_id].error_text
    assert calls["s1"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert calls["c2"].state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    assert await store.expire_pending_tool_calls(T0 + dt.timedelta(hours=1)) == 0, (
        "expiring twice changes nothing"
    )
    with pytest.raises(ToolCallNotPending):
        await store.answer_tool_calls(
            CONVERSATION, [ToolCallAnswer("c1", "output", output_json="1")], expired_before=None
        )


async def test_a_second_answer_says_the_first_was_recorded(store: Store) -> None:
    # Before: "tool call 'p1' does not wait for this answer: it is not waiting for an approval",
    # which read as if the call never asked for one.
    await _store(
        store, _user("u1", "go"), _reply("a1", ("c1", "client"), ("p1", "approval"), ("p2", "approval"))
    )
    await store.answer_tool_calls(
        CONVERSATION,
        [
            ToolCallAnswer("c1", "output", output_json="1"),
            ToolCallAnswer("p1", "approve"),
            ToolCallAnswer("p2", "deny", text="no"),
        ],
        expired_before=None,
    )
    expected = [
        (ToolCallAnswer("c1", "output", output_json="2"), "its result was recorded already"),
        (ToolCallAnswer("p1", "approve"), "its approval was answered already: it was approved"),
        (ToolCallAnswer("p1", "deny"), "its approval was answered already: it was approved"),
        (ToolCallAnswer("p2", "approve"), "its approval was answered already: it was denied"),
    ]
    for answer, why in expected:
        with pytest.raises(ToolCallNotPending, match=why):
            await store.answer_tool_calls(CONVERSATION, [answer], expired_before=None)
