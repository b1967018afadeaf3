"""The SQLite store's read-only connection, on a thread of its own.

One plain ``sqlite3`` connection (``query_only``, autocommit) on a :class:`WorkerThread`: each
read is one hand-off to the thread and one back. In WAL mode it sees only committed data and
never waits for the writer. :meth:`Reader.read_together` runs several statements on one
snapshot (``BEGIN`` … ``COMMIT`` in the same hand-off, so no other read joins the
transaction): what a view made of several reads needs (``Store.conversation_view``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turnwire_server.store.sqlite.worker_thread import WorkerThread

__all__ = ["Reader"]

Statements = Sequence[tuple[str, Sequence[Any]]]
"""``(sql, params)`` pairs, ``?`` placeholders."""


class Reader:
    """A read-only connection to the database at ``path`` (opened by :meth:`open`).

    Errors are the ``sqlite3`` ones; :class:`ValueError` once closed (what
    :data:`~turnwire_server.store.sqlite.db.DB_ERRORS` covers)."""

    def __init__(self, path: Path, busy_timeout_ms: int) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._thread: WorkerThread | None = None
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        """Connect (on the reader's thread). Raises ``sqlite3.Error`` when the file cannot be
        opened; the thread is stopped then."""
        thread = WorkerThread("sqlite-store-reader")
        try:
            self._conn = await thread.run(self._connect)
        except BaseException:
            thread.stop(self._close_connection)
            raise
        self._thread = thread

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            conn.execute("PRAGMA query_only=ON")
        except BaseException:
            conn.close()
            raise
        return conn

    async def read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of one statement."""
        return await self._require().run(self._fetch, sql, params)

    async def read_together(self, statements: Statements) -> list[list[Any]]:
        """Each statement's rows, all read on one snapshot of the database."""
        return await self._require().run(self._fetch_together, statements)

    async def close(self) -> None:
        """Close the connection once the reads queued before have run. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        closed = thread.run(self._close_connection)
        thread.stop()
        await closed

    def _require(self) -> WorkerThread:
        if self._thread is None:
            raise ValueError("the store's reader is closed")
        return self._thread

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        assert self._conn is not None
        return self._conn.execute(sql, params).fetchall()

    def _fetch_together(self, statements: Statements) -> list[list[Any]]:
        assert self._conn is not None
        conn = self._conn
        conn.execute("BEGIN")
        try:
            return [conn.execute(sql, params).fetchall() for sql, params in statements]
        finally:
            conn.execute("COMMIT")  # read-only: nothing to keep or undo

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
