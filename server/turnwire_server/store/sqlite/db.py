"""What the SQLite driver's modules share: the writer's unit of work, how it runs the shared
core's write programs, the dialect, and how ``sqlite3`` errors become :class:`StoreError`."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from turnwire_server.store.core.rows import MessageRow
from turnwire_server.store.core.sql import Program, Statement
from turnwire_server.store.core.turn_writes import CURRENT_VERSION
from turnwire_server.store.errors import StoreError, StoreFull, StoreReadOnly

__all__ = ["DB_ERRORS", "DIALECT", "WriteFn", "run_program", "store_error"]

T = TypeVar("T")

WriteFn = Callable[[sqlite3.Connection, int], None]
"""``apply(conn, now_us)``: one write's SQL on the writer's connection, inside the batch
transaction; ``now_us`` is the write's time (µs since the epoch, strictly increasing)."""

DB_ERRORS: Final = (sqlite3.Error, ValueError, OSError)
"""Errors of the database layer (the reader raises ValueError once closed)."""


def store_error(exc: BaseException, what: str) -> StoreError:
    """``exc`` as a :class:`StoreError` saying what failed (``exc`` itself when it is one): a
    full disk or size limit (``SQLITE_FULL``, ``ENOSPC``) is :class:`StoreFull`, a file or disk
    that refuses writes (``SQLITE_READONLY*``, ``EROFS``) :class:`StoreReadOnly` (issue 34,
    docs/operate/outages.md); their client text names the cause, never the file."""
    if isinstance(exc, StoreError):
        return exc
    code = getattr(exc, "sqlite_errorname", None)
    detail = f"{code}: {exc}" if code else str(exc) or type(exc).__name__
    message = f"sqlite store: {what} failed: {detail}"
    err: StoreError
    if code == "SQLITE_FULL" or getattr(exc, "errno", None) == errno.ENOSPC:
        err = StoreFull(
            message, public="no room left on the store's disk for the write; nothing of it was stored"
        )
    elif (code or "").startswith("SQLITE_READONLY") or getattr(exc, "errno", None) == errno.EROFS:
        err = StoreReadOnly(message, public="the store's file refuses writes (read-only); nothing was stored")
    else:
        err = StoreError(message)
    err.__cause__ = exc
    return err


def run_program(conn: sqlite3.Connection, program: Program[T]) -> T:
    """Run a core write ``program`` (:mod:`turnwire_server.store.core.sql`) on the writer's
    connection, inside the write's savepoint: each statement in turn; returns its result."""
    try:
        batch = next(program)
        while True:
            found: list[Any] = []
            for statement in batch:
                if statement.many:
                    conn.executemany(statement.sql, statement.params)
                    found.append(None)
                else:
                    cursor = conn.execute(statement.sql, statement.params)
                    found.append(
                        cursor.fetchall() if statement.fetch else cursor.rowcount if statement.count else None
                    )
            batch = program.send(found)
    except StopIteration as stop:
        result: T = stop.value
        return result


_INSERT_PART: Final = (
    "INSERT INTO parts (conversation_id, message_id, idx, kind, data, version)"
    f" VALUES (?, ?, ?, ?, ?, {CURRENT_VERSION})"
)


class _SqliteDialect:
    """SQLite's spelling (:class:`~turnwire_server.store.core.sql.Dialect`): one writer thread applies
    the writes one at a time, so nothing is locked; parts go in one ``executemany``; the
    conversations' lines live in the process (the store's), so no write moves them."""

    name = "sqlite"
    lock_rows = ""
    writes_with = False
    claim_rows = ""
    conversation_tables: tuple[str, ...] = ()
    lease_renewals: tuple[str, ...] = ()

    def contains_bytes(self, column: str, needle: bytes) -> str:
        return f"instr({column}, X'{needle.hex()}') > 0"

    def lock_submissions(self) -> Sequence[Statement]:
        return ()

    def submission_queued(self, submission: Any) -> Sequence[Statement]:
        return ()

    def submissions_ended(self, submission_ids: Sequence[str]) -> Sequence[Statement]:
        return ()

    def work_claimed(self, request_ids: Sequence[str], owner: str, until_us: int) -> Sequence[Statement]:
        return ()

    def events_stored(self, request_id: str) -> Sequence[Statement]:
        return ()

    def lock_conversation(self, conversation_id: str) -> Sequence[Statement]:
        return ()

    def insert_parts(self, conversation_id: str, rows: Sequence[MessageRow]) -> Sequence[Statement]:
        return (
            Statement(
                _INSERT_PART,
                [
                    (conversation_id, row.id, idx, kind, data, conversation_id)
                    for row in rows
                    for idx, (kind, data) in enumerate(row.parts)
                ],
                many=True,
            ),
        )

    def replace_parts(self, conversation_id: str, row: MessageRow) -> Sequence[Statement]:
        return (
            Statement(
                _INSERT_PART + " ON CONFLICT (conversation_id, message_id, idx) DO UPDATE"
                " SET kind = excluded.kind, data = excluded.data, version = excluded.version"
                " WHERE parts.data IS NOT excluded.data",
                [
                    (conversation_id, row.id, idx, kind, data, conversation_id)
                    for idx, (kind, data) in enumerate(row.parts)
                ],
                many=True,
            ),
            Statement(
                "DELETE FROM parts WHERE conversation_id = ? AND message_id = ? AND idx >= ?",
                (conversation_id, row.id, len(row.parts)),
            ),
        )


DIALECT: Final = _SqliteDialect()
"""The SQLite driver's :class:`~turnwire_server.store.core.sql.Dialect`."""
