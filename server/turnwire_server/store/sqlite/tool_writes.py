"""The SQLite store's writes for tool calls that wait for the client (docs/semantics.md §6, §12).

Each is a :data:`~turnwire_server.store.sqlite.writes.WriteFn`: a read-modify-write run on
the writer thread inside the batch transaction, alone (the writer applies writes one at a
time), so two answers to one message can never both see its last waiting call: exactly one
of them completes the batch. The rules themselves are :mod:`turnwire_server.store.core.tool_answers`.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import AnsweredToolCalls, ToolCallAnswer
from turnwire_server.store.core.rows import (
    LOAD_MESSAGES_SQL,
    build_message,
    message_row,
    messages_from_rows,
    to_us,
)
from turnwire_server.store.core.tool_answers import answer_calls
from turnwire_server.store.errors import StoreCorrupted
from turnwire_server.store.sqlite.writes import upsert_message
from turnwire_server.store.waiting_calls import close_call, expired_text, is_waiting

__all__ = ["AnswerWrite", "ExpireWrite"]

# A waiting call's serialized Part holds ToolCallPart.state as field 4 (tag byte 0x20) set to 2
# (input-available) or 3 (approval-requested). Filtering on those bytes in SQL skips decoding
# every other stored call; the survivors are decoded and checked exactly.
_MAYBE_WAITING = "(instr(p.data, X'2002') > 0 OR instr(p.data, X'2003') > 0)"


def _load_messages(conn: sqlite3.Connection, conversation_id: str) -> list[message_pb2.Message]:
    return messages_from_rows(conversation_id, conn.execute(LOAD_MESSAGES_SQL, (conversation_id,)))


class AnswerWrite:
    """The write of :meth:`SqliteStore.answer_tool_calls`; :attr:`outcome` is set once it ran.

    Raises (from :meth:`apply`, rolling back its savepoint) what
    :func:`~turnwire_server.store.core.tool_answers.answer_calls` raises.
    """

    def __init__(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        expired_before: dt.datetime | None,
    ) -> None:
        if not answers:
            raise ValueError("no tool call answers to record")
        self.conversation_id = conversation_id
        self.answers = tuple(answers)
        self.expired_before = expired_before
        self.outcome: AnsweredToolCalls | None = None

    def apply(self, conn: sqlite3.Connection, now_us: int) -> None:
        """Read the conversation, apply the answers, store the changed message."""
        messages = _load_messages(conn, self.conversation_id)
        message, outcome = answer_calls(
            self.conversation_id, messages, self.answers, expired_before=self.expired_before
        )
        upsert_message(conn, self.conversation_id, message_row(message), now_us)
        self.outcome = outcome


class ExpireWrite:
    """The write of :meth:`SqliteStore.expire_pending_tool_calls`; :attr:`expired` counts the calls."""

    def __init__(self, cutoff: dt.datetime) -> None:
        self.cutoff_us = to_us(cutoff, "cutoff")
        self.expired = 0

    def apply(self, conn: sqlite3.Connection, now_us: int) -> None:
        """Close every waiting call of an assistant message created before the cutoff."""
        rows = conn.execute(
            "SELECT DISTINCT m.conversation_id, m.id FROM messages AS m JOIN parts AS p"
            " ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
            " WHERE m.role = ? AND m.create_time < ? AND p.kind = 'tool_call' AND " + _MAYBE_WAITING,
            (message_pb2.ROLE_ASSISTANT, self.cutoff_us),
        ).fetchall()
        text = expired_text()
        expired = 0
        for conversation_id, message_id in rows:
            message = _load_message(conn, conversation_id, message_id)
            changed = False
            for part in message.parts:
                if part.WhichOneof("kind") == "tool_call" and is_waiting(part.tool_call):
                    close_call(part.tool_call, text)
                    changed = True
                    expired += 1
            if changed:
                upsert_message(conn, conversation_id, message_row(message), now_us)
        self.expired = expired


def _load_message(conn: sqlite3.Connection, conversation_id: str, message_id: str) -> message_pb2.Message:
    row = conn.execute(
        "SELECT role, create_time, create_time_nanos, metadata FROM messages"
        " WHERE conversation_id = ? AND id = ?",
        (conversation_id, message_id),
    ).fetchone()
    message = build_message(message_id, row[0], row[1], row[2], row[3])
    try:
        for (data,) in conn.execute(
            "SELECT data FROM parts WHERE conversation_id = ? AND message_id = ? ORDER BY idx",
            (conversation_id, message_id),
        ):
            message.parts.add().MergeFromString(data)
    except (DecodeError, RecursionError) as exc:
        raise StoreCorrupted(f"sqlite store: message {message_id!r} cannot be decoded: {exc}") from exc
    return message
