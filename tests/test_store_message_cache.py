"""Decoded messages reused between reads (store/core/message_cache.py, issue 17), on every backend: the
database stays the truth (a write by anyone else is seen on the next read), and the messages read
are shared, read-only objects: the same ones from read to read until the database changes them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from support.stores import StoreBackend

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store, TurnRecord
from turnwire_server.store.records import TurnLease


def _text(
    message_id: str, text: str, role: message_pb2.Role.ValueType = message_pb2.ROLE_USER
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message


def _turn(request_id: str) -> TurnRecord:
    return TurnRecord(
        request_id=request_id,
        conversation_id="c1",
        assistant_message_id=f"tw-a-{request_id}",
        continuation=False,
        model="scripted:x",
        state="running",
        start_time=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )


async def test_loaded_messages_are_shared_read_only_and_new_objects_once_changed(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "question"), _text("u2", "more")])
    first = await store.load_messages("c1")
    assert isinstance(first, tuple)  # no append, no item assignment: list changes fail at once
    await store.add_messages("c1", [_text("u3", "again")], mode="append", allow_missing=False)
    again = await store.load_messages("c1")
    # Unchanged messages are the very same objects (no copy per read); a new one is added.
    assert again[0] is first[0] and again[1] is first[1]
    assert [m.parts[0].text.text for m in again] == ["question", "more", "again"]
    await store.save_message("c1", _text("u2", "rewritten"))
    rewritten = await store.load_messages("c1")
    assert rewritten[1] is not again[1] and rewritten[1].parts[0].text.text == "rewritten"
    assert again[1].parts[0].text.text == "more"  # what an earlier reader holds never changes
    assert rewritten[0] is first[0] and rewritten[2] is again[2]


async def test_a_write_by_another_writer_is_seen_on_the_next_read(
    store: Store, store_backend: StoreBackend
) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "question"), _text("u2", "more")])
    await store.load_messages("c1")  # decoded and kept
    part = message_pb2.Part()
    part.text.text = "rewritten elsewhere"
    # Beside the store (another replica, an operator): same ids, other bytes.
    store_backend.sql(
        "UPDATE parts SET data = ? WHERE conversation_id = ? AND message_id = ?",
        (part.SerializeToString(deterministic=True), "c1", "u2"),
    )
    store_backend.sql("DELETE FROM parts WHERE conversation_id = ? AND message_id = ?", ("c1", "u1"))
    store_backend.sql("DELETE FROM messages WHERE conversation_id = ? AND id = ?", ("c1", "u1"))
    loaded = await store.load_messages("c1")
    assert [(m.id, m.parts[0].text.text) for m in loaded] == [("u2", "rewritten elsewhere")]
    await store.save_message("c1", _text("u2", "saved again"))
    assert [m.parts[0].text.text for m in await store.load_messages("c1")] == ["saved again"]


# ------------------------------------------------------------------ delta reads (migration 0006)


def _texts(messages: Sequence[message_pb2.Message]) -> list[tuple[str, str]]:
    return [(m.id, "".join(p.text.text for p in m.parts)) for m in messages]


def _counters(store_backend: StoreBackend, conversation_id: str = "c1") -> tuple[int, int]:
    ((version, epoch),) = store_backend.sql(
        "SELECT history_version, history_epoch FROM conversations WHERE id = ?", (conversation_id,)
    )
    return int(version), int(epoch)


async def test_another_writers_append_update_and_removal_are_seen_on_the_next_read(
    store: Store, store_backend: StoreBackend
) -> None:
    """Rows written beside the store (another replica, an older replica, an operator) bump the
    counters by trigger, so each delta read sees them."""
    await store.start_turn(_turn("r1"), [_text("u1", "one"), _text("u2", "two")])
    assert _texts(await store.load_messages("c1")) == [("u1", "one"), ("u2", "two")]
    part = message_pb2.Part()
    part.text.text = "three"
    store_backend.sql(
        "INSERT INTO messages (conversation_id, id, seq, role, create_time_nanos) VALUES (?, ?, ?, ?, 0)",
        ("c1", "u3", 3, message_pb2.ROLE_USER),
    )
    store_backend.sql(
        "INSERT INTO parts (conversation_id, message_id, idx, data) VALUES (?, ?, 0, ?)",
        ("c1", "u3", part.SerializeToString()),
    )
    assert _texts(await store.load_messages("c1")) == [("u1", "one"), ("u2", "two"), ("u3", "three")]
    part.text.text = "two, edited"
    store_backend.sql(
        "UPDATE parts SET data = ? WHERE conversation_id = ? AND message_id = ?",
        (part.SerializeToString(), "c1", "u2"),
    )
    assert _texts(await store.load_messages("c1")) == [("u1", "one"), ("u2", "two, edited"), ("u3", "three")]
    store_backend.sql("UPDATE messages SET role = ? WHERE conversation_id = ? AND id = ?", (9, "c1", "u1"))
    assert [m.role for m in await store.load_messages("c1")] == [
        9,
        message_pb2.ROLE_USER,
        message_pb2.ROLE_USER,
    ]
    _, epoch = _counters(store_backend)
    store_backend.sql("DELETE FROM parts WHERE conversation_id = ? AND message_id = ?", ("c1", "u2"))
    store_backend.sql("DELETE FROM messages WHERE conversation_id = ? AND id = ?", ("c1", "u2"))
    assert _counters(store_backend)[1] > epoch  # a removal: the next read is a whole one
    assert _texts(await store.load_messages("c1")) == [("u1", "one"), ("u3", "three")]


async def test_the_stores_own_writes_bump_the_counter_once_a_write(
    store: Store, store_backend: StoreBackend
) -> None:
    """Migration 0014: a store write bumps ``history_version`` once, however many messages and
    parts it writes, and writes them at that version (the per-row triggers skip them); what
    another writer changes next is still versioned by trigger (the test above)."""
    two_parts = _text("u2", "two")
    two_parts.parts.add().text.text = " and more"
    await store.start_turn(_turn("r1"), [_text("u1", "one"), two_parts])
    assert _counters(store_backend) == (1, 0)
    versions = "SELECT id, version FROM messages WHERE conversation_id = ? ORDER BY seq"
    assert store_backend.sql(versions, ("c1",)) == [("u1", 1), ("u2", 1)]
    assert store_backend.sql("SELECT DISTINCT version FROM parts WHERE conversation_id = ?", ("c1",)) == [
        (1,)
    ]
    await store.load_messages("c1")
    rewritten = _text("u2", "two, rewritten")
    rewritten.parts.add().text.text = " and more"
    await store.save_message("c1", rewritten)
    assert _counters(store_backend) == (2, 0)
    assert store_backend.sql(versions, ("c1",)) == [("u1", 1), ("u2", 2)]
    assert _texts(await store.load_messages("c1")) == [("u1", "one"), ("u2", "two, rewritten and more")]
    # Beside the store: a part changed with its version left as the store wrote it.
    store_backend.sql(
        "UPDATE parts SET kind = kind WHERE conversation_id = ? AND message_id = ?", ("c1", "u1")
    )
    version, _ = _counters(store_backend)
    assert version > 2 and store_backend.sql(versions, ("c1",))[0] == ("u1", version)


async def test_a_part_added_or_removed_beside_the_store_changes_its_message(
    store: Store, store_backend: StoreBackend
) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "one"), _text("u2", "two")])
    await store.load_messages("c1")
    part = message_pb2.Part()
    part.text.text = " more"
    store_backend.sql(
        "INSERT INTO parts (conversation_id, message_id, idx, data) VALUES (?, ?, 1, ?)",
        ("c1", "u1", part.SerializeToString()),
    )
    assert _texts(await store.load_messages("c1")) == [("u1", "one more"), ("u2", "two")]
    store_backend.sql(
        "DELETE FROM parts WHERE conversation_id = ? AND message_id = ? AND idx = 0", ("c1", "u2")
    )
    assert _texts(await store.load_messages("c1")) == [("u1", "one more"), ("u2", "")]


async def test_checkpoints_finish_rollback_and_discard_are_seen_between_two_reads(store: Store) -> None:
    turn = _turn("r1")
    await store.start_turn(turn, [_text("u1", "question")])
    assert _texts(await store.load_messages("c1")) == [("u1", "question")]
    reply = _text(turn.assistant_message_id, "partial", message_pb2.ROLE_ASSISTANT)
    await store.save_message("c1", reply, lease=TurnLease("r1", "", 0))
    assert _texts(await store.load_messages("c1"))[-1] == (turn.assistant_message_id, "partial")
    reply.parts[0].text.text = "partial, longer"
    await store.save_message("c1", reply, lease=TurnLease("r1", "", 0))
    assert _texts(await store.load_messages("c1"))[-1] == (turn.assistant_message_id, "partial, longer")
    await store.discard_reply(turn, turn.assistant_message_id)
    assert _texts(await store.load_messages("c1")) == [("u1", "question")]
    await store.save_message("c1", reply, lease=TurnLease("r1", "", 0))
    await store.load_messages("c1")
    await store.roll_back_turn(turn, ["u1", turn.assistant_message_id])
    assert await store.load_messages("c1") == ()


async def test_a_deleted_and_recreated_conversation_is_read_whole(
    store: Store, store_backend: StoreBackend
) -> None:
    """The counters start again at 0 for a new conversation of the same id: the conversation's
    create_time tells the reader its held messages belong to another conversation."""
    await store.start_turn(_turn("r1"), [_text(f"u{i}", f"old {i}") for i in range(5)])
    assert len(await store.load_messages("c1")) == 5
    assert await store.delete_conversation("c1")
    assert await store.load_messages("c1") == ()
    await store.start_turn(_turn("r2"), [_text("n1", "new")])
    assert _texts(await store.load_messages("c1")) == [("n1", "new")]
    assert await store.delete_conversation("c1")
    await store.start_turn(_turn("r3"), [_text("x1", "again")])
    store_backend.sql("UPDATE conversations SET create_time = create_time + 1 WHERE id = ?", ("c1",))
    assert _texts(await store.load_messages("c1")) == [("x1", "again")]


async def test_a_read_returns_only_messages_changed_since_the_held_version(
    store: Store, store_backend: StoreBackend
) -> None:
    """The delta read: a held message whose stored bytes changed without the counters moving (only
    possible by defeating the triggers, as here) is not read again, so the read did not fetch it."""
    await store.start_turn(_turn("r1"), [_text("u1", "one"), _text("u2", "two")])
    await store.load_messages("c1")
    version, _ = _counters(store_backend)
    part = message_pb2.Part()
    part.text.text = "unseen"
    store_backend.sql(
        "UPDATE parts SET data = ? WHERE conversation_id = ? AND message_id = ?",
        (part.SerializeToString(), "c1", "u1"),
    )
    # Put the counters back: u1's change is now invisible to a delta read.
    store_backend.sql("UPDATE messages SET version = ? WHERE conversation_id = ? AND id = ?", (0, "c1", "u1"))
    store_backend.sql("UPDATE conversations SET history_version = ? WHERE id = ?", (version, "c1"))
    await store.save_message("c1", _text("u3", "three"))
    assert _texts(await store.load_messages("c1")) == [("u1", "one"), ("u2", "two"), ("u3", "three")]


async def test_an_older_snapshot_finishing_last_does_not_replace_a_newer_one() -> None:
    """Two reads in flight: the one that saw less must not roll the held messages back."""
    from turnwire_server.store.core.message_cache import DecodedMessages

    cache = DecodedMessages("test")
    part = _text("u1", "one").parts[0].SerializeToString()
    part2 = _text("u2", "two").parts[0].SerializeToString()
    first = cache.read("c1")
    second = cache.read("c1")
    newer = [
        (100, 0, 2, "u1", 1, message_pb2.ROLE_USER, None, 0, None, part, 0),
        (100, 0, 2, "u2", 2, message_pb2.ROLE_USER, None, 0, None, part2, 0),
    ]
    assert _texts(cache.messages(second, newer)) == [("u1", "one"), ("u2", "two")]
    older = [(100, 0, 1, "u1", 1, message_pb2.ROLE_USER, None, 0, None, part, 0)]
    assert _texts(cache.messages(first, older)) == [("u1", "one")]  # what that snapshot held
    assert cache.read("c1").params == (100, 0, 2, "c1", "c1", 100, 0)
