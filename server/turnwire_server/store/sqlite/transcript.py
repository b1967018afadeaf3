"""The SQLite writes that edit a transcript outside a turn: AddMessages, deleting a conversation,
expiring stored turn events.

Like :mod:`turnwire_server.store.sqlite.writes`, each ``*_write`` function validates its
arguments in the caller's task and returns a :data:`~turnwire_server.store.sqlite.writes.WriteFn`
the writer thread runs inside one transaction (under the write's own savepoint, so a refusal
undoes everything the write did). Rules: docs/semantics.md §1 (AddMessages) and §12 (deleting,
retention).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import AddMode, AddResult
from turnwire_server.store.core.rows import (
    MessageRow,
    conversation_from_row,
    message_insert_params,
    message_row,
)
from turnwire_server.store.core.turn_writes import INSERT_MESSAGE
from turnwire_server.store.errors import (
    ConversationNotFound,
    MessageBeingWritten,
    MessageIdConflict,
    UnknownMessage,
)
from turnwire_server.store.sqlite.db import WriteFn
from turnwire_server.store.sqlite.writes import _put_parts, _touch_conversation

__all__ = ["AddOutcome", "add_messages_write", "delete_conversation_write"]

_CONVERSATION_TABLES: Final = (
    # Children first; turn_events hang off turn_streams by request id.
    "DELETE FROM turn_events WHERE request_id IN"
    " (SELECT request_id FROM turn_streams WHERE conversation_id = ?)",
    "DELETE FROM turn_streams WHERE conversation_id = ?",
    "DELETE FROM submissions WHERE conversation_id = ?",
    "DELETE FROM compactions WHERE conversation_id = ?",
    "DELETE FROM parts WHERE conversation_id = ?",
    "DELETE FROM messages WHERE conversation_id = ?",
    "DELETE FROM turns WHERE conversation_id = ?",
    "DELETE FROM conversations WHERE id = ?",
)


@dataclass(slots=True)
class AddOutcome:
    """Filled in by an :func:`add_messages_write` once its transaction ran (``result`` is None
    until then, and stays None when the write raised)."""

    result: AddResult | None = None


def add_messages_write(
    conversation_id: str,
    messages: Sequence[message_pb2.Message],
    *,
    mode: AddMode,
    allow_missing: bool,
    replace_only: Collection[str] = (),
    outcome: AddOutcome,
) -> WriteFn:
    """The write of :meth:`SqliteStore.add_messages`; sets ``outcome.result`` when applied.

    New ids are appended in order, with create_time the write's time when unset. A stored id:
    same role and parts (and metadata, in ``upsert`` mode) is unchanged; otherwise ``append``
    raises :class:`MessageIdConflict` and ``upsert`` replaces parts and metadata in place
    (position and create_time kept). ``upsert`` never changes a message's role
    (:class:`MessageIdConflict`) and never touches the assistant message of a ``running`` turn
    (:class:`MessageBeingWritten`). :class:`ConversationNotFound` when the conversation is
    missing and not ``allow_missing``; :class:`UnknownMessage` for an id of ``replace_only`` that
    is not stored. Any of these undoes the whole write.

    Raises :class:`ValueError` at once for a message without parts, an id repeated within
    ``messages``, an empty id or an invalid create_time.
    """
    rows = [message_row(m) for m in messages]
    seen: set[str] = set()
    for row in rows:
        if not row.parts:
            raise ValueError(f"message {row.id!r} has no parts; such messages are not stored")
        if row.id in seen:
            raise ValueError(f"message id {row.id!r} appears twice in one AddMessages request")
        seen.add(row.id)

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        exists = conn.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if exists is None and not allow_missing:
            raise ConversationNotFound(conversation_id)
        added: list[MessageRow] = []
        updated: list[MessageRow] = []
        unchanged = 0
        for row in rows:
            found = conn.execute(
                "SELECT role, metadata FROM messages WHERE conversation_id = ? AND id = ?",
                (conversation_id, row.id),
            ).fetchone()
            if found is None:
                if row.id in replace_only:
                    raise UnknownMessage(conversation_id, row.id)
                create_us = now_us if row.create_time_us is None else row.create_time_us
                added.append(dataclasses.replace(row, create_time_us=create_us))
                continue
            role, metadata = found
            same_parts = _stored_parts(conn, conversation_id, row.id) == list(row.parts)
            if role == row.role and same_parts and (mode == "append" or metadata == row.metadata):
                unchanged += 1
            elif mode == "append" or role != row.role:
                raise MessageIdConflict(conversation_id, row.id)
            else:
                _refuse_running_reply(conn, conversation_id, row.id)
                updated.append(row)
        if added or updated or exists is None:
            _touch_conversation(conn, conversation_id, now_us, len(added))
        for row in added:
            conn.execute(INSERT_MESSAGE, message_insert_params(conversation_id, row))
            _put_parts(conn, conversation_id, row)
        for row in updated:
            conn.execute(
                "UPDATE messages SET metadata = ? WHERE conversation_id = ? AND id = ?",
                (row.metadata, conversation_id, row.id),
            )
            _put_parts(conn, conversation_id, row)
        record = conn.execute(
            "SELECT id, create_time, update_time, message_count FROM conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        outcome.result = AddResult(conversation_from_row(record), len(added), len(updated), unchanged)

    return apply


def _stored_parts(
    conn: sqlite3.Connection, conversation_id: str, message_id: str
) -> list[tuple[str | None, bytes]]:
    return [
        (kind, bytes(data))
        for kind, data in conn.execute(
            "SELECT kind, data FROM parts WHERE conversation_id = ? AND message_id = ? ORDER BY idx",
            (conversation_id, message_id),
        )
    ]


def _refuse_running_reply(conn: sqlite3.Connection, conversation_id: str, message_id: str) -> None:
    running = conn.execute(
        "SELECT request_id FROM turns"
        " WHERE conversation_id = ? AND assistant_message_id = ? AND state = 'running' LIMIT 1",
        (conversation_id, message_id),
    ).fetchone()
    if running is not None:
        raise MessageBeingWritten(conversation_id, message_id, running[0])


def delete_conversation_write(conversation_id: str, outcome: list[bool]) -> WriteFn:
    """The write of :meth:`SqliteStore.delete_conversation`: every row of the conversation, in the
    conversation, message, part, turn, turn stream, turn event and submission tables. Appends to
    ``outcome`` whether anything was deleted."""

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        removed = 0
        for statement in _CONVERSATION_TABLES:
            removed += conn.execute(statement, (conversation_id,)).rowcount
        outcome.append(removed > 0)

    return apply
