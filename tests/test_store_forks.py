"""Conversation forks in the store (``Store.fork_conversation``, migration 0011; docs/forks.md), on
SQLite and PostgreSQL alike: a fork shares its source's rows (O(1) rows stored, checked in the
database), every later change is copy-on-write, deleting a source keeps its forks readable, and
deleting with forks removes them all."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from support.messages import text_message
from support.store_turns import T0, started_turn
from support.stores import StoreBackend

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store
from turnwire_server.store.errors import (
    ConversationExists,
    ForkPointNotFound,
    ForkSourceNotFound,
    MessageIdConflict,
)
from turnwire_server.store.records import CompactionRecord


def _texts(messages: object) -> list[tuple[str, str]]:
    return [(m.id, m.parts[0].text.text) for m in messages]  # type: ignore[attr-defined]


async def _conversation(store: Store, conversation_id: str, count: int) -> None:
    await store.add_messages(
        conversation_id,
        [
            text_message(
                f"m{n}", f"text {n}", message_pb2.ROLE_USER if n % 2 == 0 else message_pb2.ROLE_ASSISTANT
            )
            for n in range(count)
        ],
        mode="append",
        allow_missing=True,
    )


def _rows(backend: StoreBackend, conversation_id: str) -> tuple[int, int]:
    """``(messages, parts)`` rows the conversation itself holds in the database."""
    messages = backend.sql("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (conversation_id,))
    parts = backend.sql("SELECT COUNT(*) FROM parts WHERE conversation_id = ?", (conversation_id,))
    return int(messages[0][0]), int(parts[0][0])


async def test_a_fork_holds_the_history_up_to_its_point_and_each_side_grows_alone(store: Store) -> None:
    await _conversation(store, "src", 6)
    record = await store.fork_conversation("src", "m3", "fork")
    assert (record.conversation_id, record.message_count) == ("fork", 4)
    assert (record.forked_from_conversation_id, record.forked_from_message_id) == ("src", "m3")
    assert _texts(await store.load_messages("fork")) == [(f"m{n}", f"text {n}") for n in range(4)]

    await store.add_messages("fork", [text_message("f1", "fork input")], mode="append", allow_missing=False)
    await store.add_messages("src", [text_message("s1", "source input")], mode="append", allow_missing=False)
    assert [m for m, _ in _texts(await store.load_messages("fork"))] == ["m0", "m1", "m2", "m3", "f1"]
    assert [m for m, _ in _texts(await store.load_messages("src"))] == [f"m{n}" for n in range(6)] + ["s1"]
    fork = await store.get_conversation("fork")
    assert fork is not None and fork.message_count == 5
    # A fork of the fork reads through both.
    await store.fork_conversation("fork", "f1", "fork2")
    await store.add_messages("fork2", [text_message("g1", "deeper")], mode="append", allow_missing=False)
    assert [m for m, _ in _texts(await store.load_messages("fork2"))] == ["m0", "m1", "m2", "m3", "f1", "g1"]
    assert await store.fork_descendants("src") == ["fork", "fork2"]


async def test_forking_a_long_conversation_stores_no_copy_of_its_messages(
    store: Store, store_backend: StoreBackend
) -> None:
    await _conversation(store, "long", 1)
    # 10,000 messages written straight into the database (AddMessages would take minutes here).
    part = message_pb2.Part()
    part.text.text = "x"
    data = part.SerializeToString()
    if store_backend.name == "postgres":
        # Without the history triggers (10,000 bumps of one row take half a minute): the rows'
        # version stays 0, which a whole read returns (migration 0006).
        store_backend.sql("SET session_replication_role = replica")
    numbers = "WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 9999) "
    store_backend.sql(
        numbers + "INSERT INTO messages (conversation_id, id, seq, role, create_time, create_time_nanos)"
        " SELECT 'long', 'm' || i, i + 1, 1, 0, 0 FROM n"
    )
    store_backend.sql(
        numbers + "INSERT INTO parts (conversation_id, message_id, idx, kind, data)"
        " SELECT 'long', 'm' || i, 0, 'text', ? FROM n",
        (data,),
    )
    if store_backend.name == "postgres":
        store_backend.sql("SET session_replication_role = DEFAULT")
    store_backend.sql("UPDATE conversations SET message_count = 10000 WHERE id = 'long'")
    before = store_backend.sql("SELECT COUNT(*) FROM messages")[0][0]
    await store.fork_conversation("long", "m9999", "long-fork")
    assert _rows(store_backend, "long-fork") == (0, 0)
    assert store_backend.sql("SELECT COUNT(*) FROM messages")[0][0] == before
    assert store_backend.sql("SELECT COUNT(*) FROM fork_ancestors WHERE conversation_id = 'long-fork'") == [
        (1,)
    ]
    messages = await store.load_messages("long-fork")
    assert len(messages) == 10_000 and messages[-1].id == "m9999"
    record = await store.get_conversation("long-fork")
    assert record is not None and record.message_count == 10_000


async def test_an_upsert_on_a_shared_message_changes_one_side_only(
    store: Store, store_backend: StoreBackend
) -> None:
    await _conversation(store, "src", 4)
    await store.fork_conversation("src", "m3", "fork")
    await store.load_messages("fork")  # held in the cache: the next read is a delta read
    await store.add_messages(
        "fork",
        [text_message("m1", "edited in the fork", message_pb2.ROLE_ASSISTANT)],
        mode="upsert",
        allow_missing=False,
    )
    assert _texts(await store.load_messages("fork"))[1] == ("m1", "edited in the fork")
    assert _texts(await store.load_messages("src"))[1] == ("m1", "text 1")
    assert _rows(store_backend, "fork") == (1, 1)  # its own copy of that one message only

    await store.add_messages(
        "src", [text_message("m2", "edited in the source")], mode="upsert", allow_missing=False
    )
    assert _texts(await store.load_messages("src"))[2] == ("m2", "edited in the source")
    assert _texts(await store.load_messages("fork")) == [
        ("m0", "text 0"),
        ("m1", "edited in the fork"),
        ("m2", "text 2"),
        ("m3", "text 3"),
    ]
    # Positions stay: the fork's copies keep their places, and the source puts nothing new at a
    # position the fork shares.
    await store.add_messages("src", [text_message("s1", "later")], mode="append", allow_missing=False)
    assert [m for m, _ in _texts(await store.load_messages("fork"))] == ["m0", "m1", "m2", "m3"]


async def test_a_turn_writing_a_message_the_fork_shares_changes_the_forks_copy_only(
    store: Store, store_backend: StoreBackend
) -> None:
    """A turn's writes of its reply (``save_message`` checkpoints, ``finish_turn``) on a message
    the fork shares with its source (a continuation of the shared last reply) take the fork's own
    copy first, in the write's own batch; the source and a fork of the fork keep what they saw."""
    await _conversation(store, "src", 2)  # m0 (user), m1 (assistant)
    await store.fork_conversation("src", "m1", "fork")
    await store.fork_conversation("fork", "m1", "grandchild")
    turn = dataclasses.replace(
        await started_turn(store, "fork", 0), assistant_message_id="m1", continuation=True
    )
    so_far = text_message("m1", "continued, so far", message_pb2.ROLE_ASSISTANT)
    await store.save_message("fork", so_far, lease=turn.lease)
    assert _rows(store_backend, "fork") == (2, 2)  # its input, and its own copy of m1
    reply = text_message("m1", "continued to the end", message_pb2.ROLE_ASSISTANT)
    await store.finish_turn(dataclasses.replace(turn, state="completed", end_time=T0), reply)
    assert _texts(await store.load_messages("fork")) == [
        ("m0", "text 0"),
        ("m1", "continued to the end"),
        ("fork-u0", "q"),
    ]
    assert _texts(await store.load_messages("src")) == [("m0", "text 0"), ("m1", "text 1")]
    assert _texts(await store.load_messages("grandchild")) == [("m0", "text 0"), ("m1", "text 1")]
    record = await store.get_conversation("fork")
    assert record is not None and record.message_count == 3
    with pytest.raises(MessageIdConflict):  # a shared message's role is the stored one's
        await store.save_message("grandchild", text_message("m0", "no user's", message_pb2.ROLE_ASSISTANT))


async def test_deleting_the_source_keeps_its_forks_readable(
    store: Store, store_backend: StoreBackend
) -> None:
    await _conversation(store, "src", 5)
    await store.fork_conversation("src", "m2", "fork")
    await store.fork_conversation("fork", "m1", "fork2")
    await store.add_messages("fork", [text_message("f1", "own")], mode="append", allow_missing=False)
    held = await store.load_messages("fork")
    assert await store.delete_conversation("src")
    assert await store.get_conversation("src") is None
    assert _texts(await store.load_messages("fork")) == _texts(held)
    assert _rows(store_backend, "fork") == (4, 4)  # the shared messages are the fork's now
    assert [m for m, _ in _texts(await store.load_messages("fork2"))] == ["m0", "m1"]
    record = await store.get_conversation("fork")
    assert record is not None and record.forked_from_conversation_id == "src"  # history, kept
    await store.add_messages("fork", [text_message("f2", "after")], mode="append", allow_missing=False)
    assert [m for m, _ in _texts(await store.load_messages("fork"))] == ["m0", "m1", "m2", "f1", "f2"]


async def test_delete_with_forks_removes_them_all(store: Store, store_backend: StoreBackend) -> None:
    await _conversation(store, "src", 3)
    await store.fork_conversation("src", "m1", "a")
    await store.fork_conversation("a", "m0", "b")
    await _conversation(store, "other", 1)
    assert await store.delete_conversation("src", with_forks=True)
    for gone in ("src", "a", "b"):
        assert await store.get_conversation(gone) is None
        assert _rows(store_backend, gone) == (0, 0)
    assert store_backend.sql("SELECT COUNT(*) FROM fork_ancestors") == [(0,)]
    assert _texts(await store.load_messages("other")) == [("m0", "text 0")]


async def test_removing_a_shared_message_in_a_fork_leaves_the_source_whole(
    store: Store, store_backend: StoreBackend
) -> None:
    first = await started_turn(store, "src", 0)  # its input "src-u0"
    await store.finish_turn(dataclasses.replace(first, state="completed", end_time=T0), None)
    await _conversation(store, "src", 2)
    await store.fork_conversation("src", "m1", "fork")
    turn = dataclasses.replace(await started_turn(store, "fork", 1), state="aborted", end_time=T0)
    # A rollback in the fork removes its own input and a message it shares: the fork takes its
    # own copies of what it shares first, so the source keeps everything.
    await store.roll_back_turn(turn, ["fork-u1", "m0"])
    assert [m.id for m in await store.load_messages("fork")] == ["src-u0", "m1"]
    assert [m.id for m in await store.load_messages("src")] == ["src-u0", "m0", "m1"]
    record = await store.get_conversation("fork")
    assert record is not None and record.message_count == 2
    assert store_backend.sql("SELECT COUNT(*) FROM fork_ancestors WHERE conversation_id = 'fork'") == [(0,)]


async def test_a_fork_is_refused_with_what_to_fix(store: Store) -> None:
    await _conversation(store, "src", 2)
    await _conversation(store, "taken", 1)
    with pytest.raises(ForkSourceNotFound):
        await store.fork_conversation("missing", "m0", "new")
    with pytest.raises(ConversationExists):
        await store.fork_conversation("src", "m0", "taken")
    with pytest.raises(ForkPointNotFound):
        await store.fork_conversation("src", "nope", "new")
    assert await store.get_conversation("new") is None


async def test_the_compaction_is_carried_where_it_covers_only_shared_messages(store: Store) -> None:
    await _conversation(store, "src", 4)
    now = dt.datetime.now(dt.UTC)
    elided = (("m1", "call-1"), ("m3", "call-3"))
    await store.save_compaction(CompactionRecord("src", "m1", None, elided, "threshold", "drop", 90, 30, now))
    await store.fork_conversation("src", "m2", "covered")
    carried = await store.load_compaction("covered")
    assert carried is not None
    assert (carried.through_message_id, carried.elided_calls) == ("m1", (("m1", "call-1"),))
    await store.fork_conversation("src", "m0", "before")  # the summary reaches past the fork point
    assert await store.load_compaction("before") is None
