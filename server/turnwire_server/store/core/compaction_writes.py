"""The writes of context compaction (docs/semantics.md §9), once for both drivers (core programs,
:mod:`turnwire_server.store.core.sql`): the compacted view of a conversation and the discarded
reply of an overflowed attempt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from turnwire_server.store.core.fencing import holds_lease, lease_read
from turnwire_server.store.core.fork_writes import delete_guard_reads, delete_guard_writes
from turnwire_server.store.core.rows import COMPACTION_COLUMNS
from turnwire_server.store.core.sql import Dialect, Program, Statement
from turnwire_server.store.errors import TurnNotFound
from turnwire_server.store.records import TurnRecord

__all__ = ["discard_reply", "save_compaction"]

_SAVE_COMPACTION: Final = (
    f"INSERT INTO compactions ({COMPACTION_COLUMNS})"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?)"
    " ON CONFLICT (conversation_id) DO UPDATE SET through_message_id = excluded.through_message_id,"
    " summary = excluded.summary, elided_calls = excluded.elided_calls, reason = excluded.reason,"
    " strategy = excluded.strategy, tokens_before = excluded.tokens_before,"
    " tokens_after = excluded.tokens_after, create_time = excluded.create_time"
)


def discard_reply(turn: TurnRecord, message_id: str, dialect: Dialect, now_us: int) -> Program[None]:
    """``Store.discard_reply``: remove message ``message_id`` (its parts first) and record the
    turn's new reply id and recovery count, under the conversation's lock. Raises
    :class:`TurnNotFound`, or :class:`~turnwire_server.store.errors.LeaseLost` when another
    replica holds the turn (nothing changed)."""
    conversation_id = turn.conversation_id
    found = yield [
        *dialect.lock_conversation(conversation_id),
        *delete_guard_reads(conversation_id, (message_id,)),
        lease_read(turn.request_id, dialect),
    ]
    if not holds_lease(found[-1], turn.lease):
        raise TurnNotFound(turn.request_id)
    params = (conversation_id, message_id)
    deleted = yield [
        *delete_guard_writes(conversation_id, (message_id,), found[-3:-1], dialect),
        Statement("DELETE FROM parts WHERE conversation_id = ? AND message_id = ?", params),
        Statement("DELETE FROM messages WHERE conversation_id = ? AND id = ?", params, count=True),
    ]
    removed: int = deleted[-1]
    writes = []
    if removed:
        writes.append(
            Statement(
                "UPDATE conversations SET message_count = message_count - ?, update_time = ? WHERE id = ?",
                (removed, now_us, conversation_id),
            )
        )
    writes.append(
        Statement(
            "UPDATE turns SET assistant_message_id = ?, recovery_count = ? WHERE request_id = ?",
            (turn.assistant_message_id, turn.recovery_count, turn.request_id),
        )
    )
    yield writes


def save_compaction(conversation_id: str, params: Sequence[Any]) -> Program[None]:
    """``Store.save_compaction`` (``params``: :func:`~turnwire_server.store.core.rows.compaction_params`,
    computed in the caller's task): replace the conversation's compaction row; nothing when the
    conversation is gone."""
    yield [Statement(_SAVE_COMPACTION, (*params, conversation_id))]
