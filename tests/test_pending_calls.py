"""The one-pass search for open tool calls and the rules built on it (engine/pending_calls.py;
docs/semantics.md §6 and §8), and ``input_start``'s search from the end (engine/compaction.py)."""

from __future__ import annotations

import datetime as dt
import random

from turnwire.errors import INTERRUPTED_TOOL_ERROR
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.compaction import input_start
from turnwire_server.engine.pending_calls import (
    MOVED_PAST_TOOL_ERROR,
    PENDING_TOOL_TEXT,
    OpenCalls,
    has_open_call,
    repair_pending,
    with_pending_placeholders,
)
from turnwire_server.store.waiting_calls import expired_text

S = message_pb2
ERROR = S.TOOL_CALL_STATE_OUTPUT_ERROR
NOW = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.UTC)


def user(message_id: str) -> message_pb2.Message:
    message = S.Message(id=message_id, role=S.ROLE_USER)
    message.parts.add().text.text = "question"
    return message


def assistant(
    message_id: str,
    *calls: tuple[str, S.ToolCallState.ValueType],
    client: bool = False,
    approved: bool = False,
) -> S.Message:
    """An assistant message: text, then a call per ``(tool_call_id, state)``."""
    message = S.Message(id=message_id, role=S.ROLE_ASSISTANT)
    message.create_time.FromDatetime(NOW - dt.timedelta(seconds=60))
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.text = "answer"
    for call_id, state in calls:
        call = message.parts.add().tool_call
        call.tool_call_id, call.tool_name, call.state, call.client_executed = call_id, "t", state, client
        if state == S.TOOL_CALL_STATE_APPROVAL_RESPONDED:
            call.approval.approved = approved
        if state == S.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
            call.output_json = '"ok"'
    return message


def call_of(message: message_pb2.Message, call_id: str) -> message_pb2.ToolCallPart:
    return next(p.tool_call for p in message.parts if p.tool_call.tool_call_id == call_id)


DONE = S.TOOL_CALL_STATE_OUTPUT_AVAILABLE
WAITING = S.TOOL_CALL_STATE_INPUT_AVAILABLE
REQUESTED = S.TOOL_CALL_STATE_APPROVAL_REQUESTED


def test_find_locates_open_calls_anywhere_in_the_history() -> None:
    history = [
        user("u1"),
        assistant("a1", ("c1", WAITING), client=True),  # early: the user moved past it
        user("u2"),
        assistant("a2", ("c2", DONE), ("c3", S.TOOL_CALL_STATE_INPUT_STREAMING)),  # interrupted
        user("u3"),
        assistant("a3", ("c4", DONE)),
        user("u4"),
        assistant("a4", ("c5", REQUESTED)),
    ]
    found = OpenCalls.find(history)
    assert found.history is history
    assert found.at == (1, 3, 7)
    assert [m.id for m in found.messages()] == ["a1", "a2", "a4"]
    assert found.last_user == 6 and found.reply_at == -1


def test_find_matches_a_per_message_check_on_random_histories() -> None:
    rng = random.Random(17)
    states = [DONE, S.TOOL_CALL_STATE_OUTPUT_ERROR, S.TOOL_CALL_STATE_OUTPUT_DENIED, WAITING, REQUESTED]
    for _ in range(50):
        history = []
        for i in range(rng.randrange(0, 30)):
            if rng.random() < 0.5:
                history.append(user(f"u{i}"))
            else:
                calls = [(f"c{i}-{k}", rng.choice(states)) for k in range(rng.randrange(0, 3))]
                history.append(assistant(f"a{i}", *calls))
        found = OpenCalls.find(history)
        assert found.at == tuple(
            i for i, m in enumerate(history) if m.role == S.ROLE_ASSISTANT and has_open_call(m)
        )
        users = [i for i, m in enumerate(history) if m.role == S.ROLE_USER]
        assert found.last_user == (users[-1] if users else -1)


def test_repair_applies_the_rules_to_calls_found_early_and_late() -> None:
    history = [
        user("u1"),
        assistant("a1", ("moved", WAITING), client=True),
        user("u2"),
        assistant("a2", ("interrupted", S.TOOL_CALL_STATE_INPUT_STREAMING), ("done", DONE)),
        assistant("a3", ("denied", S.TOOL_CALL_STATE_APPROVAL_RESPONDED)),
        assistant("a4", ("approved", S.TOOL_CALL_STATE_APPROVAL_RESPONDED), approved=True),
        assistant("a5", ("waits", REQUESTED)),
    ]
    changed = repair_pending(OpenCalls.find(history), now=NOW, expiry_seconds=0)
    assert [m.id for m in changed] == ["a1", "a2", "a3"]
    moved = call_of(history[1], "moved")
    assert (moved.state, moved.error_text) == (ERROR, MOVED_PAST_TOOL_ERROR)
    interrupted = call_of(history[3], "interrupted")
    assert (interrupted.state, interrupted.error_text) == (
        S.TOOL_CALL_STATE_OUTPUT_ERROR,
        INTERRUPTED_TOOL_ERROR,
    )
    assert call_of(history[3], "done").state == DONE
    assert call_of(history[4], "denied").state == S.TOOL_CALL_STATE_OUTPUT_DENIED
    # Approved calls are left for the turn to run; a waiting call no user message follows is kept.
    assert call_of(history[5], "approved").state == S.TOOL_CALL_STATE_APPROVAL_RESPONDED
    assert call_of(history[6], "waits").state == REQUESTED


def test_repair_expires_a_waiting_call_older_than_the_expiry() -> None:
    history = [user("u1"), assistant("a1", ("old", REQUESTED))]  # created 60 s before NOW
    assert repair_pending(OpenCalls.find(history), now=NOW, expiry_seconds=120) == []
    changed = repair_pending(OpenCalls.find(history), now=NOW, expiry_seconds=30)
    assert changed == [history[1]]
    assert call_of(history[1], "old").error_text == expired_text(30)


def test_placeholders_copy_only_messages_still_open() -> None:
    history = [
        user("u1"),
        assistant("a1", ("early", WAITING), client=True),
        assistant("a2", ("closed-since", REQUESTED)),
        user("u2"),
        assistant("a3", ("late", REQUESTED), ("done", DONE)),
    ]
    found = OpenCalls.find(history)
    call_of(history[2], "closed-since").state = DONE  # e.g. an approved call that ran since
    sent = with_pending_placeholders(found)
    assert [m.id for m in sent] == ["u1", "a1", "a2", "u2", "a3"]
    assert sent[0] is history[0] and sent[2] is history[2] and sent[3] is history[3]
    for index, call_id in ((1, "early"), (4, "late")):
        assert sent[index] is not history[index]
        placeholder = call_of(sent[index], call_id)
        assert (placeholder.state, placeholder.error_text) == (
            S.TOOL_CALL_STATE_OUTPUT_ERROR,
            PENDING_TOOL_TEXT,
        )
        assert call_of(history[index], call_id).state in (WAITING, REQUESTED)  # stored one unchanged
    assert call_of(sent[4], "done").state == DONE


def test_without_reply_drops_the_reply_and_moves_the_indexes() -> None:
    history = [
        user("u1"),
        assistant("tw-a-r1", ("partial", S.TOOL_CALL_STATE_INPUT_STREAMING)),
        user("u2"),
        assistant("a2", ("waits", REQUESTED)),
    ]
    found = OpenCalls.find(history, reply_id="tw-a-r1")
    assert (found.reply_at, found.at) == (1, (1, 3))
    rest = found.without_reply()
    assert [m.id for m in rest.history] == ["u1", "u2", "a2"] and history[1].id == "tw-a-r1"
    assert (rest.at, rest.last_user, rest.reply_at) == ((2,), 1, -1)
    assert OpenCalls.find(history, reply_id="absent").without_reply().history is history


def test_input_start_is_the_first_input_message_searched_from_the_end() -> None:
    view = [user("u1"), assistant("a1"), user("u2"), user("u3"), assistant("a2")]
    assert input_start(view, ["u3", "u2"]) == 2
    assert input_start(view, ["u1"]) == 0
    assert input_start(view, []) == 4
    assert input_start(view, ["gone"]) == 4
    assert input_start([], []) == 0


def test_a_conversations_next_search_looks_only_at_appended_messages_and_sees_replacements() -> None:
    """With ``conversation_id`` a search builds on the last one while the history starts with its
    very objects (the store's shared messages, only appended to); a message replaced by a new
    object (a repair, an answer, a checkpoint), or a shorter history, is searched whole again."""
    first = (user("u1"), assistant("a1", ("waits", REQUESTED)), user("u2"), assistant("a2", ("done", DONE)))
    found = OpenCalls.find(first, conversation_id="c-incremental")
    assert (found.at, found.last_user) == ((1,), 2)
    assert isinstance(found.history, list) and found.history == list(first)

    appended = (*first, user("u3"), assistant("a3", ("late", WAITING)))
    # The searched messages are not walked again: the kept search stands for them (shown here by
    # changing one in place, which nobody does: the store's messages are shared and read-only).
    call_of(first[1], "waits").state = DONE
    again = OpenCalls.find(appended, reply_id="a1", conversation_id="c-incremental")
    assert (again.at, again.last_user, again.reply_at) == ((1, 5), 4, 1)
    call_of(first[1], "waits").state = REQUESTED
    # Another conversation's search and a search without an id are separate, and whole.
    assert OpenCalls.find(appended).at == (1, 5)
    # a1's call answered elsewhere: the store hands out a new object in its place.
    answered = S.Message()
    answered.CopyFrom(appended[1])
    call_of(answered, "waits").state = DONE
    replaced = (appended[0], answered, *appended[2:])
    assert OpenCalls.find(replaced, conversation_id="c-incremental").at == (5,)
    # A shorter history (a rollback, a deletion) is searched whole too.
    assert OpenCalls.find(first[:2], reply_id="a2", conversation_id="c-incremental").at == (1,)
    assert OpenCalls.find(first[:2], reply_id="a2", conversation_id="c-incremental").reply_at == -1


def test_repair_replaces_changed_messages_by_copies_and_never_changes_a_shared_one() -> None:
    shared = (user("u1"), assistant("a1", ("moved", WAITING), client=True), user("u2"))
    found = OpenCalls.find(shared, conversation_id="c-repair")
    [changed] = repair_pending(found, now=NOW, expiry_seconds=0)
    assert found.history[1] is changed and changed is not shared[1]
    assert call_of(changed, "moved").error_text == MOVED_PAST_TOOL_ERROR
    assert call_of(shared[1], "moved").state == WAITING  # the store's object is as it was
