"""The SQLite store's group-commit writer: one thread, one connection, one transaction per batch.

Writes queue on the event loop in call order. A writer task takes everything
pending as a batch and applies it in ONE round trip to a dedicated thread:
``BEGIN IMMEDIATE``, each write under its own savepoint, ``COMMIT``. Then it
resolves the callers' futures on the loop. A round trip per statement (as with
aiosqlite) cost ~9 thread hand-offs per write and made the loop lag under load.

The thread is a :class:`~turnwire_server.store.sqlite.worker_thread.WorkerThread`; the
plain ``sqlite3`` connection is created, used and closed only on it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from turnwire_server.store.errors import StoreError
from turnwire_server.store.metrics import COMMIT_DURATION
from turnwire_server.store.sqlite.db import DB_ERRORS, WriteFn, store_error
from turnwire_server.store.sqlite.migrations import Migration, apply_migrations
from turnwire_server.store.sqlite.wal_checkpoints import BACKSTOP_PAGES, WalCheckpoints
from turnwire_server.store.sqlite.worker_thread import WorkerThread

__all__ = ["BUSY_TIMEOUT_MS", "SqliteWriter"]

_log = logging.getLogger("turnwire_server.store.sqlite")
_COMMITS = COMMIT_DURATION.labels("sqlite", "group")

BUSY_TIMEOUT_MS: Final = 5000
"""How long a connection waits for another process's lock before failing (ms)."""


@dataclass(slots=True)
class _Write:
    apply: WriteFn  # runs on the writer thread inside the batch transaction
    future: asyncio.Future[None]
    what: str  # for error messages
    urgent: bool  # a caller waits on durability: do not hold the batch open for more


class SqliteWriter:
    """Applies writes to the database file ``path``, group-committed, on its own thread.

    ``batch_s`` (seconds, >= 0) is how long a batch of only non-urgent writes
    may wait for more; an urgent write ends the wait. Use from one event loop:
    :meth:`open`, then :meth:`submit` any number of times, then :meth:`close`.
    """

    def __init__(self, path: Path, *, batch_s: float) -> None:
        self._path = path
        self._batch_s = batch_s
        self._thread: WorkerThread | None = None
        self._conn: sqlite3.Connection | None = None  # touched only on that thread
        self._task: asyncio.Task[None] | None = None
        self._pending: collections.deque[_Write] = collections.deque()
        self._has_work = asyncio.Event()
        self._urgent = asyncio.Event()
        self._closing = False
        self._last_us = 0  # the writer thread's clock; see _now_us
        self.checkpoints: WalCheckpoints | None = None  # the WAL's, off the commit path (WAL only)

    # ------------------------------------------------------------------ lifecycle

    async def open(self, migrations: Sequence[Migration]) -> None:
        """Create the parent directories, connect (WAL, ``synchronous=NORMAL``), run pending
        ``migrations`` and start the writer task.

        Raises :class:`StoreError` when the file cannot be opened or a migration
        fails (nothing is left running then). After :meth:`close` it starts afresh.
        """
        self._closing = False
        thread = WorkerThread("sqlite-store-writer")
        try:
            wal = await thread.run(self._connect, migrations)
        except BaseException as exc:
            # Queued behind _connect even when this task was cancelled mid-way.
            thread.stop(self._close_connection)
            if isinstance(exc, DB_ERRORS):
                raise store_error(exc, f"opening {self._path}") from exc
            raise
        self._thread = thread
        self.checkpoints = WalCheckpoints(self._path) if wal else None
        self._task = asyncio.create_task(self._run(), name="sqlite-store-writer")

    async def close(self) -> None:
        """Apply every queued write, stop the task, close the connection and the thread.

        Idempotent. Raises :class:`StoreError` when closing the connection fails.
        """
        self._closing = True
        self._has_work.set()
        self._urgent.set()  # end any checkpoint batching wait now
        task, self._task = self._task, None
        if task is not None:
            await task
        checkpoints, self.checkpoints = self.checkpoints, None
        if checkpoints is not None:
            await checkpoints.close()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            await thread.run(self._close_connection)
        except DB_ERRORS as exc:
            raise store_error(exc, f"closing {self._path}") from exc
        finally:
            thread.stop()  # idle now: it exits at once

    def _connect(self, migrations: Sequence[Migration]) -> bool:  # on the writer thread
        """Open the connection and run ``migrations``; returns whether the database is in WAL mode."""
        conn = sqlite3.connect(self._path, isolation_level=None)  # we issue BEGIN/COMMIT
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            wal = mode is not None and str(mode[0]).lower() == "wal"
            if not wal:
                # Still correct, only slower: readers then wait for the writer.
                _log.warning("sqlite store %s: WAL unavailable, journal_mode=%s", self._path, mode)
            # Checkpoints run on a thread of their own (wal_checkpoints.py); a commit checkpoints
            # only when the log has grown past this (they fell behind).
            conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
            # A commit survives a process crash; an OS crash may lose the last ones.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            # Each write runs under a savepoint, so SQLite keeps the original of every page the
            # transaction changes in a statement journal; past 64 KiB that journal spills to a
            # temporary file, and every page touched after costs a write(2) (a turn's admission
            # with a budget: ~120 µs). In memory it holds the pages one write changes (released
            # with its savepoint): a turn's writes tens of KiB; a conversation's deletion, its
            # stored size, no more than a turn on it reads (bench/budget_cost.md, "The statement
            # journal in memory").
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            apply_migrations(conn, migrations, self._path, self._now_us)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return wal

    def _close_connection(self) -> None:  # on the writer thread
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # ------------------------------------------------------------------ writes

    async def submit(self, apply: WriteFn, what: str, *, urgent: bool) -> None:
        """Queue ``apply`` and return once its batch has committed.

        ``what`` names the write in error messages; ``urgent`` ends any batching
        wait. Raises :class:`StoreError` when the writer is not running or the
        batch failed, or what ``apply`` raised (database errors wrapped in
        :class:`StoreError`; the write is then undone, the rest of its batch not).
        A cancelled call may still be applied.
        """
        task = self._task
        if task is None or task.done() or self._closing:
            raise StoreError(f"sqlite store: {what}: store is not open")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Write(apply, future, what, urgent))
        self._has_work.set()
        if urgent:
            self._urgent.set()
        await future

    def _now_us(self) -> int:  # on the writer thread only, so no lock
        # Strictly increasing within the writer, so update order is total.
        now = time.time_ns() // 1000
        self._last_us = now if now > self._last_us else self._last_us + 1
        return self._last_us

    async def _run(self) -> None:
        """Apply queued writes in call order, everything pending in one transaction."""
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    self._has_work.clear()
                    await self._has_work.wait()
                    continue
                if self._batch_s > 0 and not self._urgent.is_set():
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for returns when the wait
                    # ended as this task was cancelled (close() sets _urgent, then its caller's
                    # cancel reaches this task through `await task`), and the cancel was lost.
                    with suppress(TimeoutError):
                        async with asyncio.timeout(self._batch_s):
                            await self._urgent.wait()
                batch = list(self._pending)
                self._pending.clear()
                self._urgent.clear()
                await self._apply_batch(batch)
        finally:
            # Empty after a normal close; on cancellation, fail whoever still waits (a batch on
            # the thread is settled by _apply_batch).
            err = StoreError("sqlite store: writer stopped before the write was applied")
            for write in self._pending:
                if not write.future.done():
                    write.future.set_exception(err)
            self._pending.clear()

    async def _apply_batch(self, batch: list[_Write]) -> None:
        """Commit ``batch`` in one thread round trip, then settle each write's future. Cancelled
        meanwhile, it settles them once the thread is done all the same: the batch commits or
        rolls back whatever happens on the loop, and its callers learn which."""
        assert self._thread is not None
        applies = [write.apply for write in batch]
        started = time.perf_counter()
        commit = self._thread.run(self._commit, applies)
        try:
            await asyncio.shield(commit)  # a cancel of this wait leaves the commit's future alone
        except asyncio.CancelledError:
            # Settles once the thread is done (at once, from the loop, if it already is).
            commit.add_done_callback(lambda done: _settle(batch, done, started))
            raise
        except BaseException:
            pass  # the transaction failed: _settle gives its error to every write of the batch
        _settle(batch, commit, started)
        if self.checkpoints is not None and commit.exception() is None:
            self.checkpoints.committed()

    def _commit(self, applies: list[WriteFn]) -> list[Exception | None]:  # on the writer thread
        """One transaction: each write under its own savepoint; what each raised (None: applied).

        Raises (after rolling back everything) when the transaction itself fails.
        """
        conn = self._conn
        if conn is None:
            raise StoreError("sqlite store: the writer's connection is closed")
        outcomes: list[Exception | None] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for apply in applies:
                # A savepoint per write: one failing write (an id conflict) leaves the others.
                conn.execute("SAVEPOINT write")
                try:
                    apply(conn, self._now_us())
                except Exception as exc:
                    if not conn.in_transaction:
                        # SQLite rolled the whole transaction back (SQLITE_FULL, an I/O error):
                        # no write of the batch was applied; each fails with this cause.
                        raise
                    conn.execute("ROLLBACK TO write")
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
                conn.execute("RELEASE write")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        if self.checkpoints is not None:  # the log's bound (one stat of the -wal file)
            self.checkpoints.after_commit(conn, BUSY_TIMEOUT_MS)
        return outcomes


def _settle(batch: list[_Write], commit: asyncio.Future[list[Exception | None]], started: float) -> None:
    """Resolve the futures of ``batch`` from its ``commit`` (done): each write's own outcome, or
    the transaction's error for all; ``started`` (``perf_counter``) times a commit."""
    error = commit.exception()
    if error is not None:
        what = f"writing {len(batch)} queued write(s) ({batch[0].what}, ...)"
        for write in batch:
            if not write.future.done():
                write.future.set_exception(store_error(error, what))
        return
    _COMMITS.observe(time.perf_counter() - started)
    for write, outcome in zip(batch, commit.result(), strict=True):
        if write.future.done():  # the caller was cancelled; the write still happened
            continue
        if outcome is None:
            write.future.set_result(None)
        elif isinstance(outcome, DB_ERRORS):
            write.future.set_exception(store_error(outcome, write.what))
        else:
            write.future.set_exception(outcome)
