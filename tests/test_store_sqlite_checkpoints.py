"""The SQLite store's WAL checkpoints run off the commit path (``store/sqlite/wal_checkpoints.py``):
a thread of their own checkpoints every ``COMMITS_PER_CHECKPOINT`` commits, the writer's own
only past ``BACKSTOP_PAGES``; the log stays bounded under continuous writes; a checkpoint that
fails stops them (logged) and the writes go on; closing the writer waits for one running."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from support.waiting import wait_until

from turnwire_server.store.sqlite.wal_checkpoints import (
    BACKSTOP_PAGES,
    COMMITS_PER_CHECKPOINT,
    RESTART_BYTES,
    WalCheckpoints,
)
from turnwire_server.store.sqlite.writer import SqliteWriter

PAGE = 4096
_TABLE = "CREATE TABLE rows (n INTEGER PRIMARY KEY, data BLOB)"


def _write(sql: str, *params: object) -> Callable[[sqlite3.Connection, int], None]:
    """A write that runs ``sql`` with ``params``."""

    def apply(conn: sqlite3.Connection, _: int) -> None:
        conn.execute(sql, params)

    return apply


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[SqliteWriter]:
    writer = SqliteWriter(tmp_path / "store.db", batch_s=0)
    await writer.open([])
    await writer.submit(_write(_TABLE), "create", urgent=True)
    yield writer
    await writer.close()


async def _commits(writer: SqliteWriter, count: int, *, size: int = 100) -> None:
    for _ in range(count):
        await writer.submit(
            _write("INSERT INTO rows (data) VALUES (randomblob(?))", size), "insert", urgent=True
        )


async def _largest_log(writer: SqliteWriter, path: Path, count: int) -> int:
    """``count`` commits of ~4 pages each; the ``-wal`` file's largest size after one (bytes)."""
    largest = 0
    for _ in range(count):
        await _commits(writer, 1, size=3 * PAGE)
        largest = max(largest, os.stat(path).st_size)  # a test: one stat between commits
    return largest


def _checkpoints(writer: SqliteWriter) -> WalCheckpoints:
    assert writer.checkpoints is not None, "a WAL database has background checkpoints"
    return writer.checkpoints


async def test_a_checkpoint_runs_on_its_own_thread_every_so_many_commits(writer: SqliteWriter) -> None:
    checkpoints = _checkpoints(writer)
    await _commits(writer, COMMITS_PER_CHECKPOINT - 2)  # with the table's, one short
    assert checkpoints.runs == 0
    await _commits(writer, 1)
    await wait_until(lambda: checkpoints.runs == 1, what="the background checkpoint")
    busy, log, copied = checkpoints.last or (1, 0, 0)
    assert busy == 0 and copied > 0 and copied <= log
    # The writer's own connection checkpoints only past the backstop.
    found: list[int] = []
    await writer.submit(
        lambda conn, _: found.append(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]),
        "read",
        urgent=True,
    )
    assert found == [BACKSTOP_PAGES]


async def test_the_log_stays_bounded_under_continuous_writes(writer: SqliteWriter, tmp_path: Path) -> None:
    """Passive checkpoints running while the writer appends never find the log fully copied, so
    SQLite would never start it over: the writer's checkpoint past the backstop does."""
    wal = await _largest_log(writer, tmp_path / "store.db-wal", 2_500)  # ~10,000 frames appended
    assert _checkpoints(writer).runs > 0
    assert wal <= 2 * BACKSTOP_PAGES * (PAGE + 24), f"the log grew to {wal:,} bytes"


async def test_the_log_stays_bounded_when_the_writers_own_checkpoints_never_start_it_over(
    writer: SqliteWriter, tmp_path: Path
) -> None:
    """The writer's backstop is passive: it fails while a background checkpoint runs, and a CI run
    once saw it lose that race for 2,500 commits (the log at 52 MB, as with no backstop at all).
    With it off, the writer's TRUNCATE once the file is past ``RESTART_BYTES`` keeps the bound
    (a RESTART from the background thread lost to the writer's transactions, and one due when a
    background checkpoint reported the log's length came as late as those ran, on a loaded CI
    machine: the log at 34 MB)."""
    await writer.submit(_write("PRAGMA wal_autocheckpoint=0"), "no backstop", urgent=True)
    wal = await _largest_log(writer, tmp_path / "store.db-wal", 2_500)
    checkpoints = _checkpoints(writer)
    assert checkpoints.restarts > 0, checkpoints.restarts
    assert wal <= 2 * BACKSTOP_PAGES * (PAGE + 24), f"the log grew to {wal:,} bytes"
    assert RESTART_BYTES > BACKSTOP_PAGES * (PAGE + 24)  # not reached while the writer's own work


async def test_a_reader_on_an_old_snapshot_holds_the_restart_off_and_the_writes_go_on(
    writer: SqliteWriter, tmp_path: Path
) -> None:
    """A RESTART waits for readers still on an older snapshot (at most ``RESTART_WAIT_S``): kept
    busy, it is tried again after the next commit, the commits go on meanwhile, and once the
    reader is done the log is started over."""
    await writer.submit(_write("PRAGMA wal_autocheckpoint=0"), "no backstop", urgent=True)
    reader = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM rows").fetchone()  # a snapshot of the log as it is now
        checkpoints = _checkpoints(writer)
        inserted = 0
        while not checkpoints.restart_due and inserted < 2_500:
            await _commits(writer, 1, size=3 * PAGE)
            inserted += 1
        assert checkpoints.restart_due, "the writer found the log past RESTART_BYTES"
        await _commits(writer, 3)  # each followed by a RESTART the reader keeps busy
        assert checkpoints.restarts == 0 and checkpoints.restart_due
        reader.execute("COMMIT")
    finally:
        reader.close()
    await _commits(writer, 1)
    assert checkpoints.restarts == 1 and not checkpoints.restart_due
    written: list[int] = []
    await writer.submit(
        lambda conn, _: written.append(conn.execute("SELECT count(*) FROM rows").fetchone()[0]),
        "count",
        urgent=True,
    )
    assert written == [inserted + 3 + 1]  # every commit went through, the held-off ones too


async def test_a_failing_checkpoint_stops_them_and_the_writes_go_on(
    writer: SqliteWriter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = _checkpoints(writer)

    def fails() -> tuple[int, int, int]:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(checkpoints, "_checkpoint", fails)
    with caplog.at_level(logging.WARNING, logger="turnwire_server.store.sqlite"):
        await _commits(writer, COMMITS_PER_CHECKPOINT)
        await wait_until(lambda: "background WAL checkpoints stopped" in caplog.text, what="the warning")
    caplog.clear()
    await _commits(writer, 2 * COMMITS_PER_CHECKPOINT)  # none starts again, the writes land
    assert checkpoints.runs == 0 and "checkpoint" not in caplog.text
    counted: list[int] = []
    await writer.submit(
        lambda conn, _: counted.append(conn.execute("SELECT count(*) FROM rows").fetchone()[0]),
        "count",
        urgent=True,
    )
    assert counted == [3 * COMMITS_PER_CHECKPOINT]


async def test_closing_the_writer_waits_for_a_running_checkpoint(tmp_path: Path) -> None:
    writer = SqliteWriter(tmp_path / "store.db", batch_s=0)
    await writer.open([])
    await writer.submit(_write(_TABLE), "create", urgent=True)
    checkpoints = _checkpoints(writer)
    started, release = threading.Event(), threading.Event()
    checkpoint = checkpoints._checkpoint

    def held() -> tuple[int, int, int]:
        started.set()
        release.wait(10)
        return checkpoint()

    checkpoints._checkpoint = held  # type: ignore[method-assign]
    await _commits(writer, COMMITS_PER_CHECKPOINT)
    await wait_until(started.is_set, what="the checkpoint's start")
    closing = asyncio.create_task(writer.close())
    await wait_until(lambda: checkpoints._stopped, what="the close's start")
    assert not closing.done()  # waiting for the checkpoint, held
    release.set()
    await closing
    assert release.is_set() and checkpoints.runs == 1  # it ended before the writer closed
    await wait_until(
        lambda: not any(t.name.startswith("sqlite-store-checkpoints") for t in threading.enumerate()),
        what="the checkpoint thread's exit",
    )
