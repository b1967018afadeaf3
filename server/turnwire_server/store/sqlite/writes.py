"""What each SQLite store write does, in SQL.

Each ``*_write`` function validates and serializes its arguments in the caller's
task (raising there, before anything is queued) and returns a :data:`WriteFn`:
a synchronous function the writer thread runs inside the batch transaction,
under the write's own savepoint. A :data:`WriteFn` raises to undo its write
(:class:`MessageIdConflict`, :class:`TurnAlreadyExists`, :class:`StoreError`,
or a ``sqlite3`` error); the writer rolls back to the savepoint and hands the
exception to the caller.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import TurnRecord
from turnwire_server.store.errors import (
    MessageIdConflict,
    TurnNotFound,
)
from turnwire_server.store.rows import MessageRow, check_turn, message_insert_params, message_row, to_us
from turnwire_server.store.sqlite.db import DIALECT, WriteFn, run_program
from turnwire_server.store.sqlite.submissions import finish_submission
from turnwire_server.store.turn_writes import (
    INSERT_MESSAGE,
    TOUCH_CONVERSATION,
    prepare_start_turn,
    start_turn,
)

__all__ = ["WriteFn", "finish_turn_write", "save_message_write", "start_turn_write", "upsert_message"]


def _put_parts(conn: sqlite3.Connection, conversation_id: str, row: MessageRow) -> None:
    """Make the message's parts exactly ``row.parts``, rewriting only changed ones."""
    conn.executemany(
        "INSERT INTO parts (conversation_id, message_id, idx, kind, data) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (conversation_id, message_id, idx) DO UPDATE"
        " SET kind = excluded.kind, data = excluded.data"
        " WHERE parts.data IS NOT excluded.data",
        [(conversation_id, row.id, idx, kind, data) for idx, (kind, data) in enumerate(row.parts)],
    )
    conn.execute(
        "DELETE FROM parts WHERE conversation_id = ? AND message_id = ? AND idx >= ?",
        (conversation_id, row.id, len(row.parts)),
    )


def _touch_conversation(conn: sqlite3.Connection, conversation_id: str, now_us: int, added: int) -> None:
    """Create the conversation if missing; set its update time and add ``added`` to its count."""
    conn.execute(TOUCH_CONVERSATION, (conversation_id, now_us, now_us, added))


def upsert_message(conn: sqlite3.Connection, conversation_id: str, row: MessageRow, now_us: int) -> None:
    """Insert ``row`` at the end, or replace it in place (same seq) when its id exists.

    Raises :class:`MessageIdConflict` when the stored message of that id has another role:
    a reply never overwrites someone else's message (ids of a turn's replies are the
    server's own, see ``turnwire_server.engine.ids``; this is the store's second line).
    """
    found = conn.execute(
        "SELECT role FROM messages WHERE conversation_id = ? AND id = ?", (conversation_id, row.id)
    ).fetchone()
    exists = found is not None
    if found is not None and found[0] != row.role:
        raise MessageIdConflict(conversation_id, row.id)
    _touch_conversation(conn, conversation_id, now_us, 0 if exists else 1)
    if exists:
        conn.execute(
            "UPDATE messages SET role = ?, create_time = ?, create_time_nanos = ?, metadata = ?"
            " WHERE conversation_id = ? AND id = ?",
            (
                row.role,
                row.create_time_us,
                row.create_time_nanos,
                row.metadata,
                conversation_id,
                row.id,
            ),
        )
    else:
        conn.execute(INSERT_MESSAGE, message_insert_params(conversation_id, row))
    _put_parts(conn, conversation_id, row)


def start_turn_write(turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> WriteFn:
    """The write of :meth:`SqliteStore.start_turn`: the shared core's
    :func:`~turnwire_server.store.turn_writes.start_turn` (its rules and errors), validated here
    (raising :class:`ValueError` or :class:`MessageIdConflict` at once, nothing queued)."""
    start = prepare_start_turn(turn, messages)

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        run_program(conn, start_turn(start, DIALECT, now_us))

    return apply


def save_message_write(
    conversation_id: str, message: message_pb2.Message, turn_request_id: str = ""
) -> WriteFn | None:
    """The write of :meth:`SqliteStore.save_message` (insert, or replace in place by id).

    ``None`` when ``message`` has no parts (such messages are not stored). With
    ``turn_request_id`` the write does nothing unless that turn is recorded (a late checkpoint
    of a turn whose conversation was deleted; docs/semantics.md §12, deleting).
    Raises :class:`ValueError` for an empty id or invalid create_time.
    """
    row = message_row(message)
    if not row.parts:
        return None

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        if turn_request_id and not _turn_recorded(conn, turn_request_id):
            return
        upsert_message(conn, conversation_id, row, now_us)

    return apply


def finish_turn_write(turn: TurnRecord, message: message_pb2.Message | None) -> WriteFn:
    """The write of :meth:`SqliteStore.finish_turn`: upsert ``message`` (when it has parts), end ``turn``.

    Raises :class:`ValueError` for an invalid argument. The returned function
    raises :class:`TurnNotFound` (writing nothing) when no turn ``turn.request_id`` exists:
    its conversation was deleted while it ran, and the reply must not bring it back.
    """
    check_turn(turn)
    row = message_row(message) if message is not None else None
    if row is not None and not row.parts:
        row = None
    params = (
        turn.state,
        None if turn.end_time is None else to_us(turn.end_time, "end_time"),
        turn.error,
        turn.recovery_count,
        turn.request_id,
    )

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        # Checked first: the reply of a turn whose conversation was deleted is not written at all.
        if not _turn_recorded(conn, turn.request_id):
            raise TurnNotFound(turn.request_id)
        if row is not None:
            upsert_message(conn, turn.conversation_id, row, now_us)
        conn.execute(
            "UPDATE turns SET state = ?, end_time = ?, error = ?, recovery_count = ? WHERE request_id = ?",
            params,
        )
        finish_submission(conn, turn.request_id, turn.state, turn.error, now_us)

    return apply


def roll_back_turn_write(turn: TurnRecord, message_ids: Sequence[str]) -> WriteFn:
    """The write of ``Store.roll_back_turn``: remove ``message_ids`` (parts first) from the turn's
    conversation and end ``turn`` (and its submission). The returned function raises
    :class:`TurnNotFound` (writing nothing) when no turn ``turn.request_id`` exists."""
    check_turn(turn)
    end_us = None if turn.end_time is None else to_us(turn.end_time, "end_time")
    ids = list(dict.fromkeys(message_ids))

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        if not _turn_recorded(conn, turn.request_id):
            raise TurnNotFound(turn.request_id)
        removed = 0
        for message_id in ids:
            params = (turn.conversation_id, message_id)
            conn.execute("DELETE FROM parts WHERE conversation_id = ? AND message_id = ?", params)
            removed += conn.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id = ?", params
            ).rowcount
        if removed:
            conn.execute(
                "UPDATE conversations SET message_count = message_count - ?, update_time = ? WHERE id = ?",
                (removed, now_us, turn.conversation_id),
            )
        conn.execute(
            "UPDATE turns SET state = ?, end_time = ?, error = ? WHERE request_id = ?",
            (turn.state, end_us, turn.error, turn.request_id),
        )
        finish_submission(conn, turn.request_id, turn.state, turn.error, now_us)

    return apply


def _turn_recorded(conn: sqlite3.Connection, request_id: str) -> bool:
    return conn.execute("SELECT 1 FROM turns WHERE request_id = ?", (request_id,)).fetchone() is not None


def renew_leases_write(owner: str, until_us: int, result: Callable[[int], None]) -> WriteFn:
    """The write of ``Store.renew_leases``: one UPDATE for every running turn of ``owner``."""

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        cursor = conn.execute(
            "UPDATE turns SET lease_until = ? WHERE owner = ? AND state = 'running'", (until_us, owner)
        )
        conn.execute(
            "UPDATE submissions SET lease_until = ? WHERE owner = ? AND state = 'pending'", (until_us, owner)
        )
        result(cursor.rowcount)

    return apply


def claim_turns_write(
    owner: str, lease_until_us: int, limit: int, result: Callable[[list[str]], None]
) -> WriteFn:
    """The write of ``SqliteStore.claim_interrupted_turns``: running turns another owner holds get
    ``owner`` (one process per SQLite file: those owners are dead, whatever their leases say)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT request_id FROM turns WHERE state = 'running' AND (owner IS NULL OR owner != ?)"
                " ORDER BY start_time, request_id LIMIT ?",
                (owner, limit),
            )
        ]
        conn.executemany(
            "UPDATE turns SET owner = ?, lease_until = ? WHERE request_id = ?",
            [(owner, lease_until_us, request_id) for request_id in ids],
        )
        result(ids)

    return apply
