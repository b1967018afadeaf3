"""The SQLite store's WAL checkpoints run off the commit path (``store/sqlite/wal_checkpoints.py``):
a thread of their own checkpoints every ``COMMITS_PER_CHECKPOINT`` commits, the writer's own
only past ``BACKSTOP_PAGES``; the log stays bounded under continuous writes; a checkpoint that
fails stops them (logged) and the writes go on; closing the writer waits for one running."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from support.waiting import wait_until

from turnwire_server.store.sqlite.wal_checkpoints import (
    BACKSTOP_PAGES,
    COMMITS_PER_CHECKPOINT,
    RESTART_FRAMES,
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
    await _commits(writer, 2_500, size=3 * PAGE)  # ~4 pages a commit: ~10,000 frames appended
    assert _checkpoints(writer).runs > 0
    wal = (tmp_path / "store.db-wal").stat().st_size
    assert wal <= 2 * BACKSTOP_PAGES * (PAGE + 24), f"the log grew to {wal:,} bytes"


async def test_the_log_stays_bounded_when_the_writers_own_checkpoints_never_start_it_over(
    writer: SqliteWriter, tmp_path: Path
) -> None:
    """The writer's backstop is passive: it fails while a background checkpoint runs, and a CI run
    once saw it lose that race for 2,500 commits (the log at 52 MB, as with no backstop at all).
    With it off, the background checkpoints' RESTART past ``RESTART_FRAMES`` keeps the bound."""
    await writer.submit(_write("PRAGMA wal_autocheckpoint=0"), "no backstop", urgent=True)
    await _commits(writer, 2_500, size=3 * PAGE)
    checkpoints = _checkpoints(writer)
    assert checkpoints.restarts > 0, checkpoints.restarts
    wal = (tmp_path / "store.db-wal").stat().st_size
    assert wal <= 2 * BACKSTOP_PAGES * (PAGE + 24), f"the log grew to {wal:,} bytes"
    assert RESTART_FRAMES > BACKSTOP_PAGES  # never reached while the writer's own start it over


async def test_a_failing_checkpoint_stops_them_and_the_writes_go_on(
    writer: SqliteWriter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = _checkpoints(writer)

    def fails() -> tuple[int, int, int, bool]:
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

    def held() -> tuple[int, int, int, bool]:
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
