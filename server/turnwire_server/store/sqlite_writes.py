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
from typing import Final

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import TurnRecord
from turnwire_server.store.errors import (
    MessageAlreadyAnswered,
    MessageIdConflict,
    TurnAlreadyExists,
    TurnNotFound,
)
from turnwire_server.store.sqlite_rows import (
    MessageRow,
    WriteFn,
    check_turn,
    message_insert_params,
    message_row,
    to_us,
)
from turnwire_server.store.sqlite_submissions import finish_submission, start_submission

__all__ = ["WriteFn", "finish_turn_write", "save_message_write", "start_turn_write", "upsert_message"]


_INSERT_MESSAGE: Final = (
    "INSERT INTO messages"
    " (conversation_id, id, seq, role, create_time, create_time_nanos, metadata)"
    " VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE conversation_id = ?),"
    " ?, ?, ?, ?)"
)


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
    conn.execute(
        "INSERT INTO conversations (id, create_time, update_time, message_count)"
        " VALUES (?, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET update_time = excluded.update_time,"
        " message_count = message_count + excluded.message_count",
        (conversation_id, now_us, now_us, added),
    )


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
        conn.execute(_INSERT_MESSAGE, message_insert_params(conversation_id, row))
    _put_parts(conn, conversation_id, row)


def start_turn_write(turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> WriteFn:
    """The write of :meth:`SqliteStore.start_turn`: conversation, ``messages`` appended, ``turn`` row,
    and the submission of the same id (if any) marked running.

    Idempotent input (docs/semantics.md §11): a message whose id is already stored with the
    same role and parts is not stored again; with other content it is
    :class:`MessageIdConflict`; a re-sent message that already has a completed reply is
    :class:`MessageAlreadyAnswered`. A request id whose earlier turn ended in error, aborted
    or interrupted is retried (its record replaced) when the request re-sends the same
    input; any other repeat is :class:`TurnAlreadyExists`. Nothing is written when any of these is raised.

    Raises :class:`ValueError` for an invalid argument or a message without
    parts, and :class:`MessageIdConflict` when a message id repeats within
    ``messages`` (at once; the returned function raises the others).
    """
    check_turn(turn)
    conversation_id = turn.conversation_id
    rows = [message_row(m) for m in messages]
    seen: set[str] = set()
    for row in rows:
        if not row.parts:
            raise ValueError(f"message {row.id!r} has no parts; such messages are not stored")
        if row.id in seen:
            raise MessageIdConflict(conversation_id, row.id)
        seen.add(row.id)
    turn_params = (
        turn.request_id,
        conversation_id,
        turn.assistant_message_id,
        int(turn.continuation),
        turn.model,
        turn.state,
        to_us(turn.start_time, "start_time"),
        None if turn.end_time is None else to_us(turn.end_time, "end_time"),
        turn.error,
        turn.recovery_count,
        turn.spec,
        turn.owner or None,
        None if turn.lease_until is None else to_us(turn.lease_until, "lease_until"),
    )

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        start_submission(conn, turn.request_id, now_us)
        new_rows = [row for row in rows if not _stored_identically(conn, conversation_id, row)]
        earlier = conn.execute("SELECT state FROM turns WHERE request_id = ?", (turn.request_id,)).fetchone()
        if earlier is not None:
            # A retry re-sends the same input (all of it stored already); new input under an
            # old request id is another request, and the id is taken.
            if earlier[0] not in _RETRYABLE_STATES or new_rows:
                raise TurnAlreadyExists(turn.request_id)
            conn.execute("DELETE FROM turns WHERE request_id = ?", (turn.request_id,))
        _touch_conversation(conn, conversation_id, now_us, len(new_rows))
        if new_rows:
            conn.executemany(
                _INSERT_MESSAGE, [message_insert_params(conversation_id, row) for row in new_rows]
            )
            conn.executemany(
                "INSERT INTO parts (conversation_id, message_id, idx, kind, data) VALUES (?, ?, ?, ?, ?)",
                [
                    (conversation_id, row.id, idx, kind, data)
                    for row in new_rows
                    for idx, (kind, data) in enumerate(row.parts)
                ],
            )
        conn.execute(
            "INSERT INTO turns (request_id, conversation_id, assistant_message_id,"
            " continuation, model, state, start_time, end_time, error, recovery_count, spec, owner,"
            " lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            turn_params,
        )

    return apply


_RETRYABLE_STATES = frozenset({"error", "aborted", "interrupted"})


def _stored_identically(conn: sqlite3.Connection, conversation_id: str, row: MessageRow) -> bool:
    """True when ``row`` is already stored (same id, role and parts); False when its id is free.

    Raises :class:`MessageIdConflict` for the same id with other content, and
    :class:`MessageAlreadyAnswered` for an identical message followed by a completed reply.
    """
    found = conn.execute(
        "SELECT role, seq FROM messages WHERE conversation_id = ? AND id = ?", (conversation_id, row.id)
    ).fetchone()
    if found is None:
        return False
    role, seq = found
    stored_parts = [
        (kind, bytes(data))
        for kind, data in conn.execute(
            "SELECT kind, data FROM parts WHERE conversation_id = ? AND message_id = ? ORDER BY idx",
            (conversation_id, row.id),
        )
    ]
    if role != row.role or stored_parts != [(kind, bytes(data)) for kind, data in row.parts]:
        raise MessageIdConflict(conversation_id, row.id)
    answered = conn.execute(
        "SELECT 1 FROM messages m JOIN turns t"
        " ON t.conversation_id = m.conversation_id AND t.assistant_message_id = m.id"
        " WHERE m.conversation_id = ? AND m.seq > ? AND t.state = 'completed' LIMIT 1",
        (conversation_id, seq),
    ).fetchone()
    if answered is not None:
        raise MessageAlreadyAnswered(conversation_id, row.id)
    return True


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
