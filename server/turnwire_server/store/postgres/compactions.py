"""The PostgreSQL store's SQL for context compaction (docs/semantics.md §9), mirroring
:mod:`turnwire_server.store.sqlite.compactions`: the compacted view of a conversation and the
discarded reply of an overflowed attempt. Each runs inside the caller's transaction."""

from __future__ import annotations

from turnwire_server.store.base import CompactionRecord, TurnRecord
from turnwire_server.store.core.rows import COMPACTION_COLUMNS, compaction_params
from turnwire_server.store.errors import TurnNotFound
from turnwire_server.store.postgres.db import Conn, fetch_one, lock_conversation, run

__all__ = ["discard_reply", "save_compaction"]


async def discard_reply(conn: Conn, turn: TurnRecord, message_id: str, now_us: int) -> None:
    """``Store.discard_reply``: remove message ``message_id`` (parts first) and record the
    turn's new reply id and recovery count, under the conversation's lock. Raises
    :class:`TurnNotFound`."""
    conversation_id = turn.conversation_id
    await lock_conversation(conn, conversation_id)
    if await fetch_one(conn, "SELECT 1 FROM turns WHERE request_id = %s", (turn.request_id,)) is None:
        raise TurnNotFound(turn.request_id)
    params = (conversation_id, message_id)
    await run(conn, "DELETE FROM parts WHERE conversation_id = %s AND message_id = %s", params)
    removed = await run(conn, "DELETE FROM messages WHERE conversation_id = %s AND id = %s", params)
    if removed:
        await run(
            conn,
            "UPDATE conversations SET message_count = message_count - %s, update_time = %s WHERE id = %s",
            (removed, now_us, conversation_id),
        )
    await run(
        conn,
        "UPDATE turns SET assistant_message_id = %s, recovery_count = %s WHERE request_id = %s",
        (turn.assistant_message_id, turn.recovery_count, turn.request_id),
    )


async def save_compaction(conn: Conn, record: CompactionRecord) -> None:
    """``Store.save_compaction``: replace the conversation's compaction row; nothing when the
    conversation is gone."""
    await run(
        conn,
        f"INSERT INTO compactions ({COMPACTION_COLUMNS})"
        " SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM conversations WHERE id = %s)"
        " ON CONFLICT (conversation_id) DO UPDATE SET through_message_id = excluded.through_message_id,"
        " summary = excluded.summary, elided_calls = excluded.elided_calls, reason = excluded.reason,"
        " strategy = excluded.strategy, tokens_before = excluded.tokens_before,"
        " tokens_after = excluded.tokens_after, create_time = excluded.create_time",
        (*compaction_params(record), record.conversation_id),
    )
