"""The store's transcript writes outside a turn (every backend): add_messages, delete_conversation and
retention (expired_conversations, expire_events). docs/semantics.md §1 and §12."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from support.stores import StoreBackend

from turnwire_client.v1 import message_pb2
from turnwire_server.store import (
    ConversationNotFound,
    MessageBeingWritten,
    MessageIdConflict,
    Store,
    TurnNotFound,
    TurnRecord,
    UnknownMessage,
)
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.core.stream_rows import pack_events
from turnwire_server.store.records import TurnLease

T0 = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
CONVERSATION_TABLES = {
    "conversations": "id",
    "messages": "conversation_id",
    "parts": "conversation_id",
    "turns": "conversation_id",
    "turn_streams": "conversation_id",
    "submissions": "conversation_id",
}


def _text(
    message_id: str, text: str, role: message_pb2.Role.ValueType = message_pb2.ROLE_USER
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message


def _turn(
    request_id: str, conversation_id: str = "c1", *, reply: str = "a1", state: Any = "running"
) -> TurnRecord:
    return TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id=reply,
        continuation=False,
        model="scripted:main",
        state=state,
        start_time=T0,
    )


def _sql(db: StoreBackend, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """A direct read (or write) on the database, beside the store's own connections."""
    return db.sql(sql, params)


def _rows_of(db: StoreBackend, conversation_id: str) -> dict[str, int]:
    """How many rows each table holds for the conversation (turn_events through its streams)."""
    counts = {
        table: _sql(db, f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (conversation_id,))[0][0]
        for table, column in CONVERSATION_TABLES.items()
    }
    counts["turn_events"] = _sql(
        db,
        "SELECT COUNT(*) FROM turn_events WHERE request_id IN"
        " (SELECT request_id FROM turn_streams WHERE conversation_id = ?)",
        (conversation_id,),
    )[0][0]
    return counts


def _add_stream(
    db: StoreBackend, request_id: str, conversation_id: str, end: dt.datetime | None, events: int
) -> None:
    db.sql(
        "INSERT INTO turn_streams (request_id, conversation_id, last_sequence_number, create_time,"
        " end_time) VALUES (?, ?, ?, ?, ?)",
        (request_id, conversation_id, events, to_us(T0, "t"), None if end is None else to_us(end, "t")),
    )
    # One batch row per event here (the store writes a batch per flush).
    db.executemany(
        "INSERT INTO turn_events (request_id, first_sequence_number, last_sequence_number, data)"
        " VALUES (?, ?, ?, ?)",
        [(request_id, n, n, pack_events([(n, b"event")])) for n in range(1, events + 1)],
    )


def _add_submission(db: StoreBackend, submission_id: str, conversation_id: str, seq: int) -> None:
    db.sql(
        "INSERT INTO submissions (id, conversation_id, state, request, seq, create_time)"
        " VALUES (?, ?, 'pending', ?, ?, ?)",
        (submission_id, conversation_id, b"", seq, to_us(T0, "t")),
    )


async def _ids(store: Store, conversation_id: str = "c1") -> list[str]:
    return [m.id for m in await store.load_messages(conversation_id)]


# ----------------------------------------------------------------------------- add_messages


async def test_add_messages_appends_in_order_with_counts_and_times(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "q")])
    result = await store.add_messages(
        "c1",
        [_text("n1", "note"), _text("n2", "reply", message_pb2.ROLE_ASSISTANT)],
        mode="append",
        allow_missing=False,
    )
    assert (result.added, result.updated, result.unchanged) == (2, 0, 0)
    assert result.conversation.message_count == 3
    loaded = await store.load_messages("c1")
    assert [m.id for m in loaded] == ["u1", "n1", "n2"]
    assert all(m.HasField("create_time") for m in loaded[1:])  # the write's time when unset


async def test_add_messages_repeated_is_unchanged_and_does_not_touch_the_conversation(
    store: Store,
) -> None:
    first = await store.add_messages("c1", [_text("n1", "note")], mode="append", allow_missing=True)
    again = await store.add_messages("c1", [_text("n1", "note")], mode="append", allow_missing=False)
    assert (again.added, again.updated, again.unchanged) == (0, 0, 1)
    assert again.conversation.update_time == first.conversation.update_time
    assert await _ids(store) == ["n1"]


async def test_add_messages_other_content_under_a_stored_id_writes_nothing(store: Store) -> None:
    await store.add_messages("c1", [_text("n1", "note")], mode="append", allow_missing=True)
    with pytest.raises(MessageIdConflict):
        await store.add_messages(
            "c1", [_text("n2", "new"), _text("n1", "other")], mode="append", allow_missing=False
        )
    assert await _ids(store) == ["n1"]  # n2, before the conflict, was not written either
    [stored] = await store.load_messages("c1")
    assert stored.parts[0].text.text == "note"


async def test_add_messages_to_a_missing_conversation_creates_nothing_unless_allowed(
    store: Store,
) -> None:
    with pytest.raises(ConversationNotFound):
        await store.add_messages("c1", [_text("n1", "note")], mode="append", allow_missing=False)
    assert await store.get_conversation("c1") is None
    result = await store.add_messages("c1", [_text("n1", "note")], mode="append", allow_missing=True)
    assert result.added == 1 and result.conversation.conversation_id == "c1"


async def test_add_messages_upsert_replaces_in_place_and_appends_new(store: Store) -> None:
    await store.add_messages(
        "c1",
        [_text("m1", "one"), _text("m2", "two"), _text("m3", "three")],
        mode="append",
        allow_missing=True,
    )
    before = {m.id: m.create_time for m in await store.load_messages("c1")}
    result = await store.add_messages(
        "c1",
        [_text("m2", "TWO"), _text("m3", "three"), _text("m4", "four")],
        mode="upsert",
        allow_missing=False,
    )
    assert (result.added, result.updated, result.unchanged) == (1, 1, 1)
    loaded = await store.load_messages("c1")
    assert [(m.id, m.parts[0].text.text) for m in loaded] == [
        ("m1", "one"),
        ("m2", "TWO"),
        ("m3", "three"),
        ("m4", "four"),
    ]
    assert loaded[1].create_time == before["m2"]  # replaced in place: position and time kept
    assert result.conversation.message_count == 4


async def test_add_messages_upsert_never_changes_a_role(store: Store) -> None:
    await store.add_messages("c1", [_text("m1", "one")], mode="append", allow_missing=True)
    with pytest.raises(MessageIdConflict):
        await store.add_messages(
            "c1", [_text("m1", "one", message_pb2.ROLE_ASSISTANT)], mode="upsert", allow_missing=False
        )


async def test_add_messages_upsert_refuses_the_reply_of_a_running_turn(store: Store) -> None:
    await store.start_turn(_turn("r1", reply="tw-a-r1"), [_text("u1", "q")])
    await store.save_message("c1", _text("tw-a-r1", "partial", message_pb2.ROLE_ASSISTANT))
    edit = _text("tw-a-r1", "edited", message_pb2.ROLE_ASSISTANT)
    with pytest.raises(MessageBeingWritten, match="running turn 'r1'"):
        await store.add_messages("c1", [edit], mode="upsert", allow_missing=False, replace_only={"tw-a-r1"})
    await store.finish_turn(_turn("r1", reply="tw-a-r1", state="completed"), None)
    result = await store.add_messages(
        "c1", [edit], mode="upsert", allow_missing=False, replace_only={"tw-a-r1"}
    )
    assert result.updated == 1
    assert (await store.load_messages("c1"))[1].parts[0].text.text == "edited"


async def test_add_messages_replace_only_ids_are_never_appended(store: Store) -> None:
    await store.add_messages("c1", [_text("m1", "one")], mode="append", allow_missing=True)
    with pytest.raises(UnknownMessage):
        await store.add_messages(
            "c1",
            [_text("tw-a-new", "x", message_pb2.ROLE_ASSISTANT)],
            mode="upsert",
            allow_missing=False,
            replace_only={"tw-a-new"},
        )
    assert await _ids(store) == ["m1"]


async def test_add_messages_refuses_repeated_ids_and_empty_messages(store: Store) -> None:
    with pytest.raises(ValueError, match="twice"):
        await store.add_messages("c1", [_text("m", "a"), _text("m", "a")], mode="append", allow_missing=True)
    with pytest.raises(ValueError, match="no parts"):
        await store.add_messages("c1", [message_pb2.Message(id="m")], mode="append", allow_missing=True)
    assert await store.get_conversation("c1") is None


# ----------------------------------------------------------------------------- delete_conversation


async def test_delete_conversation_removes_every_row_of_it_and_only_of_it(
    store: Store, store_backend: StoreBackend
) -> None:
    for conversation_id in ("c1", "c2"):
        await store.start_turn(_turn(f"r-{conversation_id}", conversation_id), [_text("u1", "q")])
        await store.finish_turn(
            _turn(f"r-{conversation_id}", conversation_id, state="completed"),
            _text("a1", "answer", message_pb2.ROLE_ASSISTANT),
        )
        _add_stream(store_backend, f"r-{conversation_id}", conversation_id, T0, events=3)
    _add_submission(store_backend, "s1", "c1", 1)
    _add_submission(store_backend, "s2", "c2", 2)
    assert all(_rows_of(store_backend, "c1").values())

    assert await store.delete_conversation("c1") is True

    assert _rows_of(store_backend, "c1") == dict.fromkeys((*CONVERSATION_TABLES, "turn_events"), 0)
    assert all(_rows_of(store_backend, "c2").values())
    assert await store.get_conversation("c1") is None
    assert await store.delete_conversation("c1") is False


async def test_delete_conversation_removes_rows_stored_before_the_conversation(
    store: Store, store_backend: StoreBackend
) -> None:
    _add_submission(store_backend, "s1", "c9", 1)  # submissions exist before their turn creates it
    assert await store.delete_conversation("c9") is True
    assert _rows_of(store_backend, "c9")["submissions"] == 0


async def test_a_deleted_turn_writes_nothing_back(store: Store, store_backend: StoreBackend) -> None:
    """A late checkpoint or final write of a turn whose conversation was deleted is a no-op:
    the conversation does not come back (docs/semantics.md §12)."""
    await store.start_turn(_turn("r1"), [_text("u1", "q")])
    await store.delete_conversation("c1")
    reply = _text("a1", "late", message_pb2.ROLE_ASSISTANT)
    await store.save_message("c1", reply, lease=TurnLease("r1", "", 0))
    with pytest.raises(TurnNotFound):
        await store.finish_turn(_turn("r1", state="aborted"), reply)
    assert await store.get_conversation("c1") is None
    assert _rows_of(store_backend, "c1") == dict.fromkeys((*CONVERSATION_TABLES, "turn_events"), 0)


# ----------------------------------------------------------------------------- retention


async def test_expired_conversations_are_old_idle_ones_oldest_first(
    store: Store, store_backend: StoreBackend
) -> None:
    for conversation_id in ("old-1", "old-2", "busy", "new"):
        await store.add_messages(conversation_id, [_text("m", "x")], mode="append", allow_missing=True)
    await store.start_turn(_turn("r-busy", "busy", reply="a-busy"), [])
    us = to_us(T0, "t")
    for offset, conversation_id in enumerate(("old-2", "old-1", "busy")):
        store_backend.sql(
            "UPDATE conversations SET update_time = ? WHERE id = ?", (us + offset, conversation_id)
        )
    cutoff = T0 + dt.timedelta(days=1)
    assert await store.expired_conversations(cutoff, 10) == ["old-2", "old-1"]  # busy has a running turn
    assert await store.expired_conversations(cutoff, 1) == ["old-2"]
    assert await store.expired_conversations(T0, 10) == []


async def test_expire_events_deletes_old_events_and_keeps_the_stream_row(
    store: Store, store_backend: StoreBackend
) -> None:
    _add_stream(store_backend, "old-1", "c1", T0, events=4)
    _add_stream(store_backend, "old-2", "c1", T0 + dt.timedelta(seconds=1), events=2)
    _add_stream(store_backend, "recent", "c1", T0 + dt.timedelta(hours=2), events=2)
    _add_stream(store_backend, "running", "c1", None, events=2)
    cutoff = T0 + dt.timedelta(hours=1)

    assert await store.expire_events(cutoff, 1) == 1  # bounded: one stream per call here
    assert await store.expire_events(cutoff, 10) == 1
    assert await store.expire_events(cutoff, 10) == 0

    streams = dict(_sql(store_backend, "SELECT request_id, events_expired FROM turn_streams"))
    assert streams == {"old-1": 1, "old-2": 1, "recent": 0, "running": 0}
    events = dict(_sql(store_backend, "SELECT request_id, COUNT(*) FROM turn_events GROUP BY request_id"))
    assert events == {"recent": 2, "running": 2}
