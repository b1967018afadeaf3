"""The SQLite store's writes for context compaction (docs/semantics.md §9): the compacted view
of a conversation and the discarded reply of an overflowed attempt. Each returns a
:data:`WriteFn` for the store's writer, applied inside its batch transaction."""

from __future__ import annotations

import sqlite3
from typing import Final

from turnwire_server.store.base import CompactionRecord, TurnRecord
from turnwire_server.store.core.rows import COMPACTION_COLUMNS, compaction_params
from turnwire_server.store.errors import TurnNotFound
from turnwire_server.store.sqlite.db import WriteFn

__all__ = ["DISCARD_MESSAGE_SQL", "discard_reply_write", "save_compaction_write"]

DISCARD_MESSAGE_SQL: Final = (
    "DELETE FROM parts WHERE conversation_id = ? AND message_id = ?",
    "DELETE FROM messages WHERE conversation_id = ? AND id = ?",
)
"""A message's rows, children first; the second statement's row count is the messages removed."""


def discard_reply_write(turn: TurnRecord, message_id: str) -> WriteFn:
    """The write of ``Store.discard_reply``: remove message ``message_id`` (its parts first) and
    record the turn's new reply id and recovery count. Raises :class:`TurnNotFound`."""

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        found = conn.execute("SELECT 1 FROM turns WHERE request_id = ?", (turn.request_id,)).fetchone()
        if found is None:
            raise TurnNotFound(turn.request_id)
        params = (turn.conversation_id, message_id)
        conn.execute(DISCARD_MESSAGE_SQL[0], params)
        removed = conn.execute(DISCARD_MESSAGE_SQL[1], params).rowcount
        if removed:
            conn.execute(
                "UPDATE conversations SET message_count = message_count - ?, update_time = ? WHERE id = ?",
                (removed, now_us, turn.conversation_id),
            )
        conn.execute(
            "UPDATE turns SET assistant_message_id = ?, recovery_count = ? WHERE request_id = ?",
            (turn.assistant_message_id, turn.recovery_count, turn.request_id),
        )

    return apply


def save_compaction_write(record: CompactionRecord) -> WriteFn:
    """The write of ``Store.save_compaction``: replace the conversation's compaction row; nothing
    when the conversation is gone. Raises :class:`ValueError` for an invalid create_time."""
    params = compaction_params(record)

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        conn.execute(
            f"INSERT INTO compactions ({COMPACTION_COLUMNS})"
            " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?)"
            " ON CONFLICT (conversation_id) DO UPDATE SET through_message_id = excluded.through_message_id,"
            " summary = excluded.summary, elided_calls = excluded.elided_calls, reason = excluded.reason,"
            " strategy = excluded.strategy, tokens_before = excluded.tokens_before,"
            " tokens_after = excluded.tokens_after, create_time = excluded.create_time",
            (*params, record.conversation_id),
        )

    return apply
