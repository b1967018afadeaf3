"""What only the SQLite store does: its process file lock, group commit on the writer thread,
WAL, its URLs and file errors. Behaviour every backend shares is tested in ``test_store.py``."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store import (
    MessageIdConflict,
    Store,
    StoreError,
    StoreInUse,
    TurnRecord,
    open_store,
)
from turnwire_server.store.records import CompactionRecord
from turnwire_server.store.sqlite import SqliteStore

T0 = dt.datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=dt.UTC)


def _turn(
    request_id: str = "req-1", conversation_id: str = "conv-1", *, state: Any = "running"
) -> TurnRecord:
    return TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id="asst-1",
        continuation=False,
        model="openai/gpt-test",
        state=state,
        start_time=T0,
    )


def _text(
    message_id: str, text: str, role: message_pb2.Role.ValueType = message_pb2.ROLE_USER
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    (tmp_path / "db").mkdir()  # the store never creates its folder
    s = SqliteStore(tmp_path / "db" / "turnwire.db")
    await s.open()
    yield s
    await s.close()


def _raw(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, params).fetchall()


# ----------------------------------------------------------------------------- round trips


# ----------------------------------------------------------------------------- writes


async def test_a_second_store_on_an_open_file_is_refused_before_touching_it(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    first = SqliteStore(path)
    await first.open()
    try:
        await first.start_turn(_turn("r1", "c1"), [_text("u1", "q1")])
        second = SqliteStore(path)
        with pytest.raises(StoreInUse, match="in use by another turnwire process"):
            await second.open()
        assert [t.request_id for t in await first.running_turns()] == ["r1"]
    finally:
        await first.close()
    again = SqliteStore(path)  # free once the first has closed
    await again.open()
    await again.close()


async def test_a_folder_that_takes_no_lock_file_is_not_reported_as_in_use() -> None:
    """``/proc`` (no new files there) made filelock time out, read as "in use by another turnwire
    process" (a fresh-user trial); the real cause is named instead."""
    store = SqliteStore(Path("/proc/turnwire-test.db"))
    with pytest.raises(StoreError) as raised:
        await store.open()
    assert not isinstance(raised.value, StoreInUse)
    assert "creating the lock file /proc/turnwire-test.db.lock failed" in str(raised.value)


async def test_the_database_is_in_wal_mode(store: SqliteStore) -> None:
    assert _raw(store.path, "PRAGMA journal_mode") == [("wal",)]


# ----------------------------------------------------------------------------- group commit


async def test_concurrent_saves_land_in_call_order_in_few_transactions(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_sizes: list[int] = []
    original = store._writer._apply_batch

    async def spy(batch: list[Any]) -> None:
        batch_sizes.append(len(batch))
        await original(batch)

    monkeypatch.setattr(store._writer, "_apply_batch", spy)
    await store.start_turn(_turn(), [_text("u0", "q")])

    await asyncio.gather(*(store.save_message("conv-1", _text(f"m{i}", str(i))) for i in range(50)))
    # Same id saved repeatedly: the last call wins.
    await asyncio.gather(*(store.save_message("conv-1", _text("m0", f"v{i}")) for i in range(30)))

    loaded = await store.load_messages("conv-1")
    assert [m.id for m in loaded] == ["u0"] + [f"m{i}" for i in range(50)]
    assert loaded[1].parts[0].text.text == "v29"
    assert sum(batch_sizes) == 81
    assert len(batch_sizes) < 10  # 80 saves shared a handful of transactions
    conversation = await store.get_conversation("conv-1")
    assert conversation is not None
    assert conversation.message_count == 51


async def test_a_batch_costs_one_writer_thread_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Checkpoints wait for the urgent start_turn, so all 21 writes form one batch.
    store = SqliteStore(tmp_path / "hops.db", checkpoint_batch_ms=60_000)
    await store.open()
    try:
        thread = store._writer._thread
        assert thread is not None
        submitted: list[Any] = []
        original_run = thread.run

        def counting_run(fn: Any, /, *args: Any) -> Any:
            submitted.append(fn)
            return original_run(fn, *args)

        monkeypatch.setattr(thread, "run", counting_run)
        batch_sizes: list[int] = []
        original_batch = store._writer._apply_batch

        async def spy(batch: list[Any]) -> None:
            batch_sizes.append(len(batch))
            await original_batch(batch)

        monkeypatch.setattr(store._writer, "_apply_batch", spy)
        saves = [asyncio.create_task(store.save_message("c", _text(f"m{i}", str(i)))) for i in range(20)]
        await wait_until(lambda: len(store._writer._pending) == 20, what="the 20 saves are queued")
        await store.start_turn(_turn("r1", "c"), [_text("u1", "q")])
        await asyncio.gather(*saves)

        assert batch_sizes == [21]
        assert len(submitted) == 1  # BEGIN, 21 savepoints and writes, COMMIT: one hop
        assert [m.id for m in await store.load_messages("c")] == [f"m{i}" for i in range(20)] + ["u1"]

        # A batch with a failing write still costs one hop, and only that write is undone.
        results = await asyncio.gather(
            store.save_message("c", _text("m0", "replaced")),
            store.start_turn(_turn("r2", "c"), [_text("u1", "dup")]),
            store.finish_turn(_turn("r1", "c", state="completed"), None),
            return_exceptions=True,
        )
        assert isinstance(results[1], MessageIdConflict)
        assert results[0] is None and results[2] is None
        assert batch_sizes == [21, 3]
        assert len(submitted) == 2
        assert (await store.load_messages("c"))[0].parts[0].text.text == "replaced"
    finally:
        await store.close()


async def test_the_writer_reads_an_admissions_history_only_when_it_is_few_rows(tmp_path: Path) -> None:
    """``start_turn`` brings the history back, read in the writer's transaction, for a new
    conversation and for one whose messages the process holds (then only the changes since);
    otherwise None (a whole read would hold up the writer), the caller reads. What it brings is
    what the reader gives, the very objects the process keeps."""
    path = tmp_path / "admission.db"
    store = SqliteStore(path)
    await store.open()
    try:
        new = await store.start_turn(_turn("r1", "new"), [_text("u1", "hi")])
        assert new is not None and [m.id for m in new] == ["u1"]
        loaded = await store.load_messages("new")
        assert list(loaded) == list(new) and all(a is b for a, b in zip(loaded, new, strict=True))
        await store.finish_turn(
            _turn("r1", "new", state="completed"), _text("asst-1", "ok", message_pb2.ROLE_ASSISTANT)
        )
        # Held since the first start: the reply (written since) and the input, read as changes.
        held = await store.start_turn(_turn("r2", "new"), [_text("u2", "more")])
        assert held is not None and [m.id for m in held] == ["u1", "asst-1", "u2"]
        assert held[0] is new[0]  # the held message, not read again
        assert list(held) == list(await store.load_messages("new"))

        # A fork holds its sources' messages without rows of its own: its first turn's history
        # would be a whole read, so the caller reads it; once held, the changes come back.
        await store.fork_conversation("new", "asst-1", "fork")
        assert await store.start_turn(_turn("r3", "fork"), [_text("f1", "fork q")]) is None
        assert [m.id for m in await store.load_messages("fork")] == ["u1", "asst-1", "f1"]
        await store.finish_turn(_turn("r3", "fork", state="completed"), None)
        forked = await store.start_turn(_turn("r4", "fork"), [_text("f2", "again")])
        assert forked is not None and [m.id for m in forked] == ["u1", "asst-1", "f1", "f2"]
        assert list(forked) == list(await store.load_messages("fork"))

        # A refused admission decodes nothing and leaves what is held as it was.
        with pytest.raises(MessageIdConflict):
            await store.start_turn(_turn("r5", "fork"), [_text("f2", "other text")])
        assert [m.id for m in await store.load_messages("fork")] == ["u1", "asst-1", "f1", "f2"]
    finally:
        await store.close()

    # Another process (a restart) holds nothing of the conversation: a whole read, by the caller.
    store = SqliteStore(path)
    await store.open()
    try:
        await store.finish_turn(_turn("r2", "new", state="completed"), None)
        assert await store.start_turn(_turn("r6", "new"), [_text("u3", "later")]) is None
        assert [m.id for m in await store.load_messages("new")] == ["u1", "asst-1", "u2", "u3"]
    finally:
        await store.close()


async def test_a_failed_transaction_fails_each_write_of_its_batch_and_the_writer_goes_on(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose transaction fails (a full disk, an I/O error: SQLite rolls it all back) gives
    each of its callers that error; the writer then applies the next writes. (A bound on the wait:
    a writer that lost the batch's outcome would leave its callers waiting forever.)"""
    original = store._writer._commit
    failing = [True]

    def commit(applies: Any) -> Any:
        if failing[0]:
            raise sqlite3.OperationalError("disk I/O error")
        return original(applies)

    monkeypatch.setattr(store._writer, "_commit", commit)
    async with asyncio.timeout(10):
        results = await asyncio.gather(
            store.save_message("c", _text("m1", "one")),
            store.save_message("c", _text("m2", "two")),
            return_exceptions=True,
        )
        assert all(isinstance(r, StoreError) and "disk I/O error" in str(r) for r in results), results
        failing[0] = False
        await store.save_message("c", _text("m3", "three"))
    assert [m.id for m in await store.load_messages("c")] == ["m3"]


class _WatchedEvent(asyncio.Event):
    """An :class:`asyncio.Event` whose ``waited_on`` is set once somebody waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited_on = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.waited_on.set()
        return await super().wait()


async def test_checkpoint_batching_waits_but_turn_writes_do_not(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "b.db", checkpoint_batch_ms=60_000)
    await store.open()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        urgent = _WatchedEvent()
        store._writer._urgent = urgent
        save = asyncio.create_task(store.save_message("c", _text("m1", "x")))
        # The writer has the save and waits for more (or an urgent write) instead of committing it.
        await wait_until(
            lambda: urgent.waited_on.is_set() and len(store._writer._pending) == 1,
            what="the writer holds the save back, waiting for more",
        )
        assert not save.done()  # held back to gather more checkpoints
        await store.start_turn(_turn("r1", "c"), [_text("u1", "y")])  # cuts the wait short
        await save
        assert loop.time() - started < 10
        assert [m.id for m in await store.load_messages("c")] == ["m1", "u1"]
        pending = asyncio.create_task(store.save_message("c", _text("m2", "z")))
        await wait_until(lambda: store._writer._pending, what="the save of m2 is queued")
    finally:
        await store.close()  # flushes the held checkpoint without waiting the full minute
    await pending
    reopened = SqliteStore(tmp_path / "b.db")
    await reopened.open()
    try:
        assert [m.id for m in await reopened.load_messages("c")] == ["m1", "u1", "m2"]
    finally:
        await reopened.close()


@pytest.mark.parametrize("ticks", [1, 2, 3])
async def test_a_close_cancelled_as_the_writer_flushes_is_cancelled_and_its_writes_tell_the_truth(
    tmp_path: Path, ticks: int
) -> None:
    # close() ends the writer's wait for more checkpoints and awaits the writer, so a cancel of
    # close's caller in the next few loop ticks reaches the writer as that wait ends, or while
    # its batch commits on the thread. It must stay a cancel (Python 3.11's wait_for returned
    # from the wait as if not cancelled, and so did close), and the held save must report what
    # the thread did (a batch cancelled mid-commit was applied yet reported as not).
    store = SqliteStore(tmp_path / "c.db", checkpoint_batch_ms=60_000)
    await store.open()
    try:
        urgent = _WatchedEvent()
        store._writer._urgent = urgent
        save = asyncio.create_task(store.save_message("c", _text("m1", "x")))
        await wait_until(urgent.waited_on.is_set, what="the writer holds the save back, waiting for more")
        closing = asyncio.create_task(store.close())
        for _ in range(ticks):
            await asyncio.sleep(0)  # a loop tick, not a wait for time
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        try:
            await save
            stored = ["m1"]
        except StoreError as error:
            assert "writer stopped before the write was applied" in str(error)
            stored = []
    finally:
        await store.close()  # a second close finishes what the cancelled one left
    reopened = SqliteStore(tmp_path / "c.db")
    await reopened.open()
    try:
        assert [m.id for m in await reopened.load_messages("c")] == stored
    finally:
        await reopened.close()


# ----------------------------------------------------------------------------- reads


# ----------------------------------------------------------------------------- migrations


async def test_store_errors(tmp_path: Path) -> None:
    not_open = SqliteStore(tmp_path / "x.db")
    with pytest.raises(StoreError, match="not open"):
        await not_open.save_message("c", _text("m", "x"))
    with pytest.raises(StoreError, match="not open"):
        await not_open.get_conversation("c")

    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match=r"opening .*dir\.db"):
        await SqliteStore(tmp_path / "dir.db").open()

    closed = SqliteStore(tmp_path / "y.db")
    await closed.open()
    await closed.close()
    await closed.close()  # idempotent
    with pytest.raises(StoreError):
        await closed.start_turn(_turn(), [_text("u", "x")])
    with pytest.raises(StoreError, match="closed"):
        await closed.open()
    with pytest.raises(StoreError):
        await closed.load_messages("c")


# ----------------------------------------------------------------------------- turn lock


# ----------------------------------------------------------------------------- factory


def test_open_store_parses_sqlite_urls(tmp_path: Path) -> None:
    relative = open_store("sqlite:///data/turnwire.db")
    assert isinstance(relative, SqliteStore)
    assert relative.path == Path("data/turnwire.db")
    absolute = open_store(f"sqlite:///{tmp_path}/t.db")  # tmp_path starts with "/"
    assert isinstance(absolute, SqliteStore)
    assert absolute.path == tmp_path / "t.db"
    assert isinstance(absolute, Store)
    assert not (tmp_path / "t.db").exists()  # not opened


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://relative.db",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite:///x.db?mode=ro",
        "turnwire.db",
        "",
    ],
)
def test_open_store_rejects_other_urls(url: str) -> None:
    with pytest.raises(ValueError):
        open_store(url)


def _running_turn_at_an_old_schema(conn: sqlite3.Connection, request_id: str) -> None:
    """Conversation ``c1`` and its turn ``request_id``, running, in the columns of schema 3 (every
    later migration's columns have defaults)."""
    conn.execute(
        "INSERT INTO conversations (id, create_time, update_time, message_count) VALUES ('c1', 1, 1, 0)"
    )
    conn.execute(
        "INSERT INTO turns (request_id, conversation_id, assistant_message_id, continuation, model,"
        " state, start_time, recovery_count) VALUES (?, 'c1', ?, 0, 'm', 'running', 1, 0)",
        (request_id, f"tw-a-{request_id}"),
    )


async def test_a_database_of_the_previous_schema_is_migrated_with_its_data_kept(tmp_path: Path) -> None:
    """Upgrading: a file at schema 3 (an earlier release) gets migrations 4 to 8 at open; its rows
    are read back (messages from before 6 by the first, whole read, then deltas), its running turn
    (no lease renewed) is claimed for recovery, and its conversation takes a compaction."""
    from turnwire_server.store.sqlite.migrations import apply_migrations, load_migrations

    path = tmp_path / "previous.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        apply_migrations(conn, load_migrations()[:3], path, lambda: 1)
        _running_turn_at_an_old_schema(conn, "r-old")
        conn.execute("INSERT INTO messages (conversation_id, id, seq, role) VALUES ('c1', 'u-old', 1, 1)")
        part = message_pb2.Part()
        part.text.text = "old"
        conn.execute(
            "INSERT INTO parts (conversation_id, message_id, idx, data) VALUES ('c1', 'u-old', 0, ?)",
            (part.SerializeToString(),),
        )
    finally:
        conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        assert [m.id for m in await store.load_messages("c1")] == ["u-old"]
        new = message_pb2.Message(id="u-new", role=message_pb2.ROLE_USER)
        new.parts.add().text.text = "new"
        await store.save_message("c1", new)
        assert [m.parts[0].text.text for m in await store.load_messages("c1")] == ["old", "new"]
        assert [t.request_id for t in await store.running_turns()] == ["r-old"]
        now = dt.datetime.now(dt.UTC)
        claimed = await store.claim_interrupted_turns("me", now, now + dt.timedelta(seconds=30), 10)
        assert [(t.request_id, t.owner) for t in claimed] == [("r-old", "me")]
        record = CompactionRecord("c1", "", None, (("m", "call"),), "threshold", "drop", 9, 3, now)
        await store.save_compaction(record)
        assert await store.load_compaction("c1") == record
    finally:
        await store.close()
    assert [v for (v,) in _raw(path, "SELECT version FROM schema_migrations ORDER BY version")] == list(
        range(1, 17)
    )


async def test_the_lean_reservations_migration_keeps_a_running_turns_reservation(tmp_path: Path) -> None:
    """Migration 0015 rebuilds ``budget_reservations`` clustered on its key, without the index by
    conversation: a reservation stored at schema 14 is there after it, and is settled once, at
    what it reserved (a lost attempt's), by the charge that settles it."""
    from turnwire_server.store.records import BudgetCharge, BudgetKey, BudgetSpend
    from turnwire_server.store.sqlite.migrations import apply_migrations, load_migrations

    path = tmp_path / "schema14.db"
    tenant = ("tenant/day", "", "2026-12-05")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        apply_migrations(conn, load_migrations()[:14], path, lambda: 1)
        _running_turn_at_an_old_schema(conn, "r1")
        conn.execute(
            "INSERT INTO budget_spend (scope, scope_key, period, reserved_tokens, reserved_usd)"
            " VALUES (?, ?, ?, 700, 0.25)",
            tenant,
        )
        conn.execute("INSERT INTO budget_reservations VALUES ('r1', ?, ?, ?, 'c1', 1, 700, 0.25)", tenant)
    finally:
        conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        (table,) = _raw(path, "SELECT sql FROM sqlite_master WHERE name = 'budget_reservations'")[0]
        assert "WITHOUT ROWID" in table
        assert not _raw(
            path,
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND tbl_name = 'budget_reservations'"
            " AND sql IS NOT NULL",
        )
        assert _raw(path, "SELECT request_id, tokens, usd FROM budget_reservations") == [("r1", 700, 0.25)]
        grant = await store.charge_budget(BudgetCharge("r1", "c1", None, ()))
        assert grant.spends[BudgetKey(*tenant)] == BudgetSpend(700, 0.25, 0, 0.0)
        assert _raw(path, "SELECT 1 FROM budget_reservations") == []
        assert await store.delete_conversation("c1")
    finally:
        await store.close()


@pytest.mark.parametrize("read_only", ["file", "folder"])
async def test_a_store_on_a_read_only_mount_says_the_filesystem_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: str
) -> None:
    # A fresh-user trial: a store on a read-only mount (EROFS) was told to chmod u+w, which cannot
    # help. Mounting needs privileges a test may not have, so the mount flag is simulated.
    import os

    path = tmp_path / "data" / "turnwire.db"
    path.parent.mkdir()
    if read_only == "file":
        path.write_bytes(b"")
    target = path if read_only == "file" else path.parent
    real_access, real_statvfs = os.access, os.statvfs

    def statvfs(p: Any) -> Any:
        result = real_statvfs(p)
        if Path(p) != target:
            return result
        return SimpleNamespace(f_flag=result.f_flag | os.ST_RDONLY)

    monkeypatch.setattr(
        "turnwire_server.store.sqlite.store.os.access",
        lambda p, mode: False if Path(p) == target else real_access(p, mode),
    )
    monkeypatch.setattr("turnwire_server.store.sqlite.store.os.statvfs", statvfs)
    with pytest.raises(StoreError) as raised:
        await SqliteStore(path).open()
    message = str(raised.value)
    assert f"store {read_only} {target} is on a filesystem mounted read-only" in message
    assert "set store.url to a file on a writable filesystem" in message
    assert "chmod u+w" not in message
    assert not (path.parent / "turnwire.db.lock").exists()


@pytest.mark.parametrize("read_only", ["file", "folder"])
async def test_a_read_only_store_says_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: str
) -> None:
    # Root (as in CI) may write anything, so the permission check is what is simulated here.
    import os

    path = tmp_path / "data" / "turnwire.db"
    path.parent.mkdir()
    if read_only == "file":
        path.write_bytes(b"")
    target = path if read_only == "file" else path.parent
    real_access = os.access
    monkeypatch.setattr(
        "turnwire_server.store.sqlite.store.os.access",
        lambda p, mode: False if Path(p) == target else real_access(p, mode),
    )
    store = SqliteStore(path)
    with pytest.raises(StoreError, match=f"store {read_only} {target} is read-only"):
        await store.open()
    assert not (path.parent / "turnwire.db.lock").exists()
