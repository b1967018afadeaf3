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
from turnwire_server.store.core import message_writes
from turnwire_server.store.core.rows import MessageRow
from turnwire_server.store.core.sql import just
from turnwire_server.store.core.turn_writes import (
    TOUCH_CONVERSATION,
    prepare_start_turn,
    start_turn,
)
from turnwire_server.store.sqlite.db import DIALECT, WriteFn, run_program

__all__ = ["WriteFn", "finish_turn_write", "save_message_write", "start_turn_write", "upsert_message"]


def _put_parts(conn: sqlite3.Connection, conversation_id: str, row: MessageRow) -> None:
    """Make the message's parts exactly ``row.parts``, rewriting only changed ones."""
    run_program(conn, just(DIALECT.replace_parts(conversation_id, row)))


def _touch_conversation(conn: sqlite3.Connection, conversation_id: str, now_us: int, added: int) -> None:
    """Create the conversation if missing; set its update time and add ``added`` to its count."""
    conn.execute(TOUCH_CONVERSATION, (conversation_id, now_us, now_us, added))


def upsert_message(conn: sqlite3.Connection, conversation_id: str, row: MessageRow, now_us: int) -> None:
    """The shared :func:`~turnwire_server.store.core.message_writes.upsert_message` (raises
    :class:`MessageIdConflict` when the stored message of that id has another role)."""
    run_program(conn, message_writes.upsert_message(conversation_id, row, DIALECT, now_us))


def start_turn_write(turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> WriteFn:
    """The write of :meth:`SqliteStore.start_turn`: the shared core's
    :func:`~turnwire_server.store.core.turn_writes.start_turn` (its rules and errors), validated here
    (raising :class:`ValueError` or :class:`MessageIdConflict` at once, nothing queued)."""
    start = prepare_start_turn(turn, messages)

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        run_program(conn, start_turn(start, DIALECT, now_us))

    return apply


def save_message_write(
    conversation_id: str, message: message_pb2.Message, turn_request_id: str = ""
) -> WriteFn | None:
    """The write of :meth:`SqliteStore.save_message`: the shared
    :func:`~turnwire_server.store.core.message_writes.save_message`. ``None`` when ``message`` has no
    parts (such messages are not stored). Raises :class:`ValueError` for an empty id or invalid
    create_time."""
    row = message_writes.prepare_save_message(message)
    if row is None:
        return None

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        run_program(conn, message_writes.save_message(conversation_id, row, turn_request_id, DIALECT, now_us))

    return apply


def finish_turn_write(turn: TurnRecord, message: message_pb2.Message | None) -> WriteFn:
    """The write of :meth:`SqliteStore.finish_turn`: the shared
    :func:`~turnwire_server.store.core.message_writes.finish_turn`. Raises :class:`ValueError` for an
    invalid argument; the returned function raises :class:`TurnNotFound` (writing nothing)."""
    finish = message_writes.prepare_finish_turn(turn, message)

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        run_program(conn, message_writes.finish_turn(finish, DIALECT, now_us))

    return apply


def roll_back_turn_write(turn: TurnRecord, message_ids: Sequence[str]) -> WriteFn:
    """The write of ``Store.roll_back_turn``: the shared
    :func:`~turnwire_server.store.core.message_writes.roll_back_turn`."""
    finish, ids = message_writes.prepare_roll_back(turn, message_ids)

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        run_program(conn, message_writes.roll_back_turn(finish, ids, DIALECT, now_us))

    return apply


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
