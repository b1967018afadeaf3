"""The SQLite store's WAL checkpoints, off the commit path.

In WAL mode every commit appends the pages it changed to the ``-wal`` file, and a checkpoint
copies them back into the database file (and syncs both: ``synchronous=NORMAL``). SQLite runs
one by itself inside the ``COMMIT`` that takes the log past ``wal_autocheckpoint`` pages, so one
commit in every thirty or so paid 10 to 15 ms for everyone's pages, and a turn whose admission it
was started that much later (the time to its first token's p99 was 15 to 21 ms, bench/ttft.md,
"the WAL's checkpoints off the commit path"). Here a
thread of its own, with its own connection, checkpoints after every
:data:`COMMITS_PER_CHECKPOINT` commits (``PRAGMA wal_checkpoint(PASSIVE)``: it copies what no
reader still needs, never waits for a lock and never blocks the writer), so the writer's commits
only append. A passive checkpoint that runs while the writer appends never finds the log fully
copied, and SQLite starts the log over only then; the writer's own checkpoint stays on at
:data:`BACKSTOP_PAGES` (what is left to copy by then is little) so the ``-wal`` file stays
bounded under continuous writes. That one is passive too, and fails while a background one
runs (a CI run once saw it lose that race for 2,500 commits in a row). So after each commit
the writer looks at the ``-wal`` file's size (one ``stat``), and once it is past
:data:`RESTART_BYTES` the background checkpoints pause and the writer itself runs a ``TRUNCATE``
checkpoint on its own connection (:meth:`WalCheckpoints.after_commit`): no other writer can
hold it up then and no background checkpoint competes, only readers still on an older snapshot
may, for at most :data:`RESTART_WAIT_S` (then it tries again after the next commit); it copies
what is left and empties the file. Two earlier shapes lost under load: a ``RESTART`` from the
background thread competed with the writer's transactions (hundreds of commits in a row), and
a trigger from the background checkpoints' reports came as late as those ran (CI, 2 cores: the
log at 34 MB). A background checkpoint that fails is logged once and the background ones stop;
the writer's keep the log bounded (https://www.sqlite.org/wal.html, "Checkpointing";
https://www.sqlite.org/pragma.html#pragma_wal_checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Final

from turnwire_server.store.sqlite.worker_thread import WorkerThread

__all__ = ["BACKSTOP_PAGES", "COMMITS_PER_CHECKPOINT", "RESTART_BYTES", "RESTART_WAIT_S", "WalCheckpoints"]

_log = logging.getLogger("turnwire_server.store.sqlite")

COMMITS_PER_CHECKPOINT: Final = 32
"""Commits between two background checkpoints (a turn's are two to a few dozen pages each)."""

BACKSTOP_PAGES: Final = 4000
"""The writer connection's ``wal_autocheckpoint`` (pages, 16 MiB at 4 KiB): reached only when
the background checkpoints fall behind or never find the log fully copied."""

RESTART_BYTES: Final = (BACKSTOP_PAGES + BACKSTOP_PAGES // 4) * (4096 + 24)
"""The ``-wal`` file's size past which the writer empties it after a commit (``TRUNCATE``): a
quarter past the backstop's pages, as frames of SQLite's default 4 KiB page plus their 24-byte
headers (~20.6 MB). The writer's own checkpoint at :data:`BACKSTOP_PAGES` did not start the log
over then; never reached while it does, so the writer is not held up by it then."""

RESTART_WAIT_S: Final = 0.1
"""How long the writer's ``TRUNCATE`` checkpoint waits for readers still on an older snapshot
(its connection's busy timeout meanwhile; the writes queued wait that long); past it the
checkpoint gives up and the writer tries again after its next commit."""


class WalCheckpoints:
    """Background checkpoints of the WAL of the database file ``path``: :meth:`committed` after
    each commit (on the event loop), :meth:`close` once the writer has stopped. At most one
    checkpoint runs at a time, on this object's own thread and connection; ``runs`` counts those
    that completed, ``last`` the last one's ``(busy, log frames, frames copied)``; the writer
    calls :meth:`after_commit` after each commit, ``restart_due`` is True while the log is past
    its bound and ``restarts`` counts the times the writer emptied it."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._wal = f"{path}-wal"
        self._thread = WorkerThread("sqlite-store-checkpoints")
        self._conn: sqlite3.Connection | None = None  # touched only on that thread
        self._commits = 0
        self._running: asyncio.Future[tuple[int, int, int]] | None = None
        self._idle = threading.Event()  # clear while a background checkpoint may run
        self._idle.set()
        self._stopped = False
        self._closed = False
        self.runs = 0
        self.restarts = 0
        self.restart_due = False  # set and cleared by the writer's thread
        self._restart_failed = False
        self.last: tuple[int, int, int] | None = None

    def committed(self) -> None:
        """A commit was appended to the log: start a checkpoint when :data:`COMMITS_PER_CHECKPOINT`
        have been since the last one started and none is running."""
        self._commits += 1
        if self._commits < COMMITS_PER_CHECKPOINT or self._running is not None or self._stopped:
            return
        if self.restart_due:  # the writer's RESTART is due: no checkpoint of ours competes with it
            return
        self._commits = 0
        self._idle.clear()
        self._running = self._thread.run(self._checkpoint)
        self._running.add_done_callback(self._done)

    def _done(self, done: asyncio.Future[tuple[int, int, int]]) -> None:
        self._running = None
        self._idle.set()  # (also when it never ran: cancelled at close)
        if done.cancelled():
            return
        error = done.exception()
        if error is None:
            busy, log, copied = done.result()
            self.runs += 1
            self.last = (busy, log, copied)
            return
        self._stopped = True  # the writer's own checkpoints keep the log bounded
        _log.warning("sqlite store %s: background WAL checkpoints stopped: %s", self._path.name, error)

    def _checkpoint(self) -> tuple[int, int, int]:  # on the thread
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, isolation_level=None)
            busy, log, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            return int(busy), int(log), int(copied)
        finally:
            self._idle.set()

    def after_commit(self, conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
        """On the writer's thread, after each commit, with its connection ``conn`` (whose busy
        timeout, ``busy_timeout_ms``, is restored after): when the ``-wal`` file is past
        :data:`RESTART_BYTES`, a ``TRUNCATE`` checkpoint, waiting at most :data:`RESTART_WAIT_S`
        for readers on an older snapshot, after waiting as long for a background checkpoint still
        running (none starts meanwhile; a running one makes it fail at once). Done, the file is
        empty and ``restart_due`` clears; kept busy, the writer tries again after its next commit.
        Never raises: the commit before it stands, and a failure is logged once (the writer's own
        checkpoints still run)."""
        try:
            if os.stat(self._wal).st_size <= RESTART_BYTES:
                return
        except OSError:  # no log file (yet, or any more): nothing to bound
            return
        self.restart_due = True
        # A background checkpoint still running makes the TRUNCATE fail at once: wait for it (at
        # most RESTART_WAIT_S a commit), so the writer's commits slow down past the bound instead
        # of growing the log for as long as that checkpoint runs (CI, loaded: 44.8 MB).
        self._idle.wait(RESTART_WAIT_S)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(RESTART_WAIT_S * 1000)}")
            try:
                # What the background ones copied is not copied again: only the rest is.
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        except sqlite3.Error as error:
            if not self._restart_failed:
                self._restart_failed = True
                _log.warning("sqlite store %s: the writer's WAL restart failed: %s", self._path.name, error)
            return
        if not busy:
            self.restarts += 1
            self.restart_due = False

    def _close_connection(self) -> None:  # on the thread
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error as error:  # it wrote nothing of its own: nothing is lost
                _log.warning("sqlite store %s: closing the checkpoint connection: %s", self._path.name, error)

    async def close(self) -> None:
        """Wait for a running checkpoint, then close the connection and the thread. Idempotent."""
        if self._closed:
            return
        self._closed = self._stopped = True
        running = self._running
        if running is not None:
            await asyncio.wait((running,))
        try:
            await self._thread.run(self._close_connection)
        finally:
            self._thread.stop()  # idle now: it exits at once
