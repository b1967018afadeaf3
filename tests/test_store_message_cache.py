"""Decoded messages reused between reads (store/message_cache.py, issue 17), on every backend: the
database stays the truth (a write by anyone else is seen on the next read), and what a caller does
to the messages it got never reaches another read."""

from __future__ import annotations

import datetime as dt

from support.stores import StoreBackend

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store, TurnRecord


def _text(message_id: str, text: str, role: int = message_pb2.ROLE_USER) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)  # type: ignore[arg-type]
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


async def test_a_callers_changes_to_loaded_messages_never_reach_the_next_read(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "question"), _text("u2", "more")])
    first = await store.load_messages("c1")
    first[0].parts[0].text.text = "changed by the caller"
    first[1].parts.add().text.text = "added by the caller"
    again = await store.load_messages("c1")
    assert [m.parts[0].text.text for m in again] == ["question", "more"]
    assert [len(m.parts) for m in again] == [1, 1]
    assert again[0] is not first[0]


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
