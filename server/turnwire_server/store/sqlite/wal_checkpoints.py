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
runs: when the log is still past :data:`RESTART_FRAMES` the background checkpoint is followed by
a ``RESTART`` one (it waits for the writer's transaction and the readers, at most
:data:`RESTART_WAIT_S`, copies what is left and has the next commit start the log over), so the
bound does not rest on who wins that race (a CI run once saw the writer's lose it for 2,500
commits in a row). A checkpoint that fails is logged once and the background ones stop; the
writer's keep the log bounded (https://www.sqlite.org/wal.html, "Checkpointing";
https://www.sqlite.org/pragma.html#pragma_wal_checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Final

from turnwire_server.store.sqlite.worker_thread import WorkerThread

__all__ = ["BACKSTOP_PAGES", "COMMITS_PER_CHECKPOINT", "RESTART_FRAMES", "RESTART_WAIT_S", "WalCheckpoints"]

_log = logging.getLogger("turnwire_server.store.sqlite")

COMMITS_PER_CHECKPOINT: Final = 32
"""Commits between two background checkpoints (a turn's are two to a few dozen pages each)."""

BACKSTOP_PAGES: Final = 4000
"""The writer connection's ``wal_autocheckpoint`` (pages, 16 MiB at 4 KiB): reached only when
the background checkpoints fall behind or never find the log fully copied."""

RESTART_FRAMES: Final = BACKSTOP_PAGES + BACKSTOP_PAGES // 4
"""The log's length (frames) past which a background checkpoint is followed by a ``RESTART``
one: the writer's own checkpoint at :data:`BACKSTOP_PAGES` did not start the log over. Never
reached while it does, so the writer is not held up by it then."""

RESTART_WAIT_S: Final = 0.1
"""How long a ``RESTART`` checkpoint waits for the writer's transaction and for readers still
on the log (the checkpoint connection's busy timeout; the writer waits meanwhile); past it the
checkpoint gives up and the next one tries again."""


class WalCheckpoints:
    """Background checkpoints of the WAL of the database file ``path``: :meth:`committed` after
    each commit (on the event loop), :meth:`close` once the writer has stopped. At most one
    checkpoint runs at a time, on this object's own thread and connection; ``runs`` counts those
    that completed, ``restarts`` the ``RESTART`` ones among them that were not kept busy, ``last``
    is the last one's ``(busy, log frames, frames copied)``."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._thread = WorkerThread("sqlite-store-checkpoints")
        self._conn: sqlite3.Connection | None = None  # touched only on that thread
        self._commits = 0
        self._running: asyncio.Future[tuple[int, int, int, bool]] | None = None
        self._stopped = False
        self._closed = False
        self.runs = 0
        self.restarts = 0
        self.last: tuple[int, int, int] | None = None

    def committed(self) -> None:
        """A commit was appended to the log: start a checkpoint when :data:`COMMITS_PER_CHECKPOINT`
        have been since the last one started and none is running."""
        self._commits += 1
        if self._commits < COMMITS_PER_CHECKPOINT or self._running is not None or self._stopped:
            return
        self._commits = 0
        self._running = self._thread.run(self._checkpoint)
        self._running.add_done_callback(self._done)

    def _done(self, done: asyncio.Future[tuple[int, int, int, bool]]) -> None:
        self._running = None
        if done.cancelled():
            return
        error = done.exception()
        if error is None:
            busy, log, copied, restarted = done.result()
            self.runs += 1
            self.restarts += restarted and not busy
            self.last = (busy, log, copied)
            return
        self._stopped = True  # the writer's own checkpoints keep the log bounded
        _log.warning("sqlite store %s: background WAL checkpoints stopped: %s", self._path.name, error)

    def _checkpoint(self) -> tuple[int, int, int, bool]:  # on the thread
        if self._conn is None:
            # The busy timeout bounds only a RESTART's waits: a passive checkpoint never waits.
            self._conn = sqlite3.connect(self._path, isolation_level=None, timeout=RESTART_WAIT_S)
        busy, log, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if log < RESTART_FRAMES:
            return int(busy), int(log), int(copied), False
        # What the passive one copied is not copied again: the writer waits for the rest only.
        busy, log, copied = self._conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        return int(busy), int(log), int(copied), True

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
