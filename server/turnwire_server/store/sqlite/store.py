"""The SQLite store backend: one process, WAL mode, group-committed writes.

Two connections to one database file: a writer, a plain ``sqlite3`` connection
on its own thread that applies queued writes in call order and batches
everything pending into one transaction (group commit; see
:mod:`turnwire_server.store.sqlite.writer`), and a read-only reader on a thread of its own
(:mod:`turnwire_server.store.sqlite.reader`). In WAL mode the reader sees only committed data
and never waits for the writer.

The schema lives in ``server/store/migrations/sqlite/NNNN_name.sql``; pending
migrations run at :meth:`SqliteStore.open` (see :mod:`turnwire_server.store.sqlite.migrations`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import filelock

from turnwire_client.v1 import message_pb2
from turnwire_server.store.core import turn_writes
from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.message_cache import DecodedMessages, HistoryRead
from turnwire_server.store.core.reads import CoreReads
from turnwire_server.store.core.schedule_writes import CoreSchedules
from turnwire_server.store.core.sql import Program, Statement
from turnwire_server.store.core.turn_writes import prepare_start_turn
from turnwire_server.store.core.webhook_store import CoreWebhooks
from turnwire_server.store.core.writes import ALONE, Commit, CoreWrites
from turnwire_server.store.errors import StoreError, StoreInUse
from turnwire_server.store.records import (
    BudgetCharge,
    BudgetLimits,
    TurnAdmission,
    TurnRecord,
    renewed_lease,
)
from turnwire_server.store.sqlite.db import DB_ERRORS, DIALECT, run_program, store_error
from turnwire_server.store.sqlite.migrations import Migration, load_migrations
from turnwire_server.store.sqlite.reader import Reader
from turnwire_server.store.sqlite.writer import BUSY_TIMEOUT_MS, SqliteWriter
from turnwire_server.store.sqlite_location import missing_directory

__all__ = ["Migration", "SqliteStore", "load_migrations"]

T = TypeVar("T")


def read_only_problem(path: Path) -> str | None:
    """Why the store at ``path`` (in a folder that exists) cannot be written, or None. SQLite in WAL
    mode writes the file, its ``-wal`` and ``-shm`` files and the sidecar's ``.lock`` beside it, so
    both the file (when it exists) and its folder must be writable; SQLite itself would only
    say ``unable to open database file``. A read-only mount (``EROFS``) is told apart from
    permissions: chmod cannot help there, only a store on another filesystem can."""
    if path.exists() and not os.access(path, os.W_OK):
        if _on_read_only_mount(path):
            return _read_only_mount_problem("file", path)
        return (
            f"store file {path} is read-only; make it writable (chmod u+w) or set store.url "
            "to a writable file"
        )
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        if _on_read_only_mount(folder):
            return _read_only_mount_problem("folder", folder)
        return (
            f"store folder {folder} is read-only; the store writes {path.name} and its -wal, -shm and .lock "
            "files there: make the folder writable or set store.url to a file in a writable folder"
        )
    return None


def _on_read_only_mount(path: Path) -> bool:
    """Whether ``path`` is on a filesystem mounted read-only (``statvfs``'s ``ST_RDONLY``)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _read_only_mount_problem(kind: str, path: Path) -> str:
    return (
        f"store {kind} {path} is on a filesystem mounted read-only, so making it writable (chmod) "
        "cannot help; set store.url to a file on a writable filesystem (for example a volume "
        "mounted read-write)"
    )


class SqliteStore(CoreWrites, CoreReads, CoreSchedules, CoreWebhooks):
    """:class:`~turnwire_server.store.base.Store` on one SQLite database file, for one process.

    ``path`` is the database file; missing parent directories are created at
    :meth:`open`. ``checkpoint_batch_ms`` (milliseconds, >= 0) is how long the
    writer may wait after a :meth:`save_message` to gather more writes into the
    same transaction; :meth:`start_turn` and :meth:`finish_turn` cut the wait
    short. 0 commits as soon as the writer is free (writes that queued while it
    was busy still share one transaction).

    Durability: a write's coroutine returns once its transaction has committed.
    With ``synchronous=NORMAL`` a commit survives a process crash; an OS crash
    or power loss may lose the last commits. A cancelled write call may still
    be applied.

    Methods raise :class:`StoreError` when the database fails or the store is
    not open, and :class:`ValueError` for arguments no backend could store
    (empty message id, naive datetime, invalid Timestamp, unknown turn state).
    All calls must come from the event loop that ran :meth:`open`. Not for
    ``:memory:`` databases: the reader needs to share the writer's file.
    """

    _store_name = "sqlite"
    _dialect = DIALECT
    _locks: LocalTurnLocks

    def __init__(self, path: str | Path, *, checkpoint_batch_ms: float = 0) -> None:
        if str(path) in ("", ":memory:") or str(path).startswith("file:"):
            raise ValueError(f"SqliteStore needs a database file path, got {str(path)!r}")
        if checkpoint_batch_ms < 0:
            raise ValueError(f"checkpoint_batch_ms must be >= 0, got {checkpoint_batch_ms}")
        self._path = Path(path)
        # One server process per database file: its turn lock lives in the process.
        self._process_lock = filelock.FileLock(f"{self._path}.lock", timeout=0)
        self._writer = SqliteWriter(self._path, batch_s=checkpoint_batch_ms / 1000)
        self._reader: Reader | None = None
        self._opened = False
        self._closing = False
        self._locks = LocalTurnLocks()
        # Decoded messages reused between a conversation's reads (issue 17).
        self._decoded = DecodedMessages("sqlite")

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Take the database's process lock, connect, enable WAL, run pending migrations and start
        the writer.

        The embedded store serves one process (its turn lock and its crash recovery are that
        process's): a second process opening the same file gets :class:`StoreInUse` before
        anything is read or written, instead of marking the first one's live turns as crashed.
        The lock is an OS file lock on ``<path>.lock``, released by the OS when the process
        dies, SIGKILL included.

        The file is created when missing, its directory never: a directory that does not exist is
        a mistyped path, not a new store (:mod:`turnwire_server.store.sqlite_location`).

        Raises :class:`StoreInUse`, or :class:`StoreError` when the directory does not exist, the
        file cannot be opened, a migration fails, or the database's schema is newer than this code
        knows. A no-op when already open; a closed store cannot be reopened (make a new one).
        """
        if self._opened:
            return
        if self._closing:
            raise StoreError("sqlite store: closed; create a new SqliteStore to reopen")
        for check in (missing_directory, read_only_problem):
            if (problem := check(self._path)) is not None:
                raise StoreError(problem)
        try:
            self._process_lock.acquire()
        except filelock.Timeout:
            # filelock also times out when the lock file cannot be created at all (a folder such
            # as /proc that takes no new files): only a lock file that opens is held by another.
            try:
                os.close(os.open(self._process_lock.lock_file, os.O_RDWR | os.O_CREAT, 0o644))
            except OSError as exc:
                raise store_error(exc, f"creating the lock file {self._process_lock.lock_file}") from exc
            raise StoreInUse(self._path) from None
        except OSError as exc:
            raise store_error(exc, f"locking {self._path}") from exc
        try:
            await self._writer.open(load_migrations())
        except BaseException:
            self._process_lock.release()
            raise
        reader = Reader(self._path, BUSY_TIMEOUT_MS)
        try:
            await reader.open()
        except BaseException as exc:
            with suppress(Exception):
                await self._writer.close()
            if isinstance(exc, DB_ERRORS):
                raise store_error(exc, f"opening {self._path}") from exc
            raise
        self._reader = reader
        self._opened = True
        # The turn queue of one process lives in memory: what a previous process left gets its
        # place in line back, first the turns it ran (recovered, or ended, first), then pending
        # submissions in acceptance order (their turns run when claimed).
        for request_id, conversation_id in await self._read(
            "open",
            "SELECT request_id, conversation_id FROM turns WHERE state = 'running'"
            " ORDER BY start_time, request_id",
            (),
        ) + await self._read(
            "open", "SELECT id, conversation_id FROM submissions WHERE state = 'pending' ORDER BY seq", ()
        ):
            self._locks.reserve(conversation_id, request_id)

    async def close(self) -> None:
        """Apply every queued write, then close both connections. Idempotent."""
        self._closing = True
        self._opened = False
        errors: list[BaseException] = []
        try:
            await self._writer.close()
        except StoreError as exc:
            errors.append(exc)
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                await reader.close()
            except DB_ERRORS as exc:
                errors.append(exc)
        self._process_lock.release()
        if errors:
            raise store_error(errors[0], f"closing {self._path}")

    # ------------------------------------------------------------------ a turn's start and lock

    async def start_turn(
        self, turn: TurnRecord, messages: Sequence[message_pb2.Message]
    ) -> Sequence[message_pb2.Message] | None:
        """Returns the conversation's messages as the commit left them when the writer read them
        in its transaction (:func:`_with_history`: a new conversation, or one whose messages this
        process holds), else None (the caller loads them)."""
        return (await self._start_turn(turn, messages, None)).history

    async def _start_turn(
        self,
        turn: TurnRecord,
        messages: Sequence[message_pb2.Message],
        budget: BudgetCharge | None,
        refuse: Sequence[BudgetLimits] = (),
    ) -> TurnAdmission:
        start = prepare_start_turn(turn, messages)
        read = self._decoded.read(turn.conversation_id)
        grant, rows = await self._commit(
            f"start_turn({turn.request_id!r})",
            lambda now_us: _with_history(
                turn_writes.start_turn(start, DIALECT, now_us, budget, refuse), read
            ),
        )
        # Decoded here, on the event loop (the cache is the loop's), once the commit succeeded.
        history = None if rows is None else self._decoded.messages(read, rows)
        return TurnAdmission(history=history, budget=grant)

    @asynccontextmanager
    async def admit_turn(
        self,
        turn: TurnRecord,
        messages: Sequence[message_pb2.Message],
        *,
        lease_seconds: float,
        read_compaction: bool,
        queued: Callable[[bool], None],
        first: bool = False,
        budget: BudgetCharge | None = None,
        refuse: Sequence[BudgetLimits] = (),
    ) -> AsyncIterator[TurnAdmission]:
        """:meth:`turn_lock`, then :meth:`start_turn` in it (``budget`` and the ``refuse`` check
        riding its commit): the lock is in the process, so only the commit reaches the database,
        with the history read as :meth:`start_turn` says. ``queued`` is called only when the lock
        is not free at once."""
        waits = self._locks.head(turn.conversation_id) not in (None, turn.request_id)
        if waits:
            queued(True)
        async with self.turn_lock(turn.conversation_id, request_id=turn.request_id, first=first):
            if waits:
                queued(False)
            yield await self._start_turn(renewed_lease(turn, lease_seconds), messages, budget, refuse)

    def turn_lock(
        self,
        conversation_id: str,
        *,
        request_id: str = "",
        owner: str = "",
        lease_seconds: float = 30.0,
        first: bool = False,
    ) -> AbstractAsyncContextManager[None]:
        """In this process (:class:`LocalTurnLocks`), from the place a submission ``request_id``
        reserved at acceptance if it did; owner and lease are not needed."""
        return self._locks.hold(conversation_id, request_id, first=first)

    # ------------------------------------------------------------------ one process per file

    async def queue_head(self, conversation_id: str) -> str | None:
        return self._locks.head(conversation_id)

    async def reserve_place(
        self,
        conversation_id: str,
        request_id: str,
        *,
        owner: str,
        lease_seconds: float,
        first: bool = False,
        only_if_idle: bool = False,
    ) -> str | None:
        """A place in the in-process line. Nothing is awaited, so the check of ``only_if_idle``
        and the reservation are one step for this process's event loop; ``owner`` and
        ``lease_seconds`` do not apply."""
        head = self._locks.head(conversation_id)
        if only_if_idle and head is not None:
            return head
        self._locks.reserve(conversation_id, request_id, first=first)
        return None

    async def release_place(self, conversation_id: str, request_id: str) -> None:
        self._locks.drop(request_id)

    async def request_cancel(self, request_id: str, *, stop: str = "") -> bool:
        """False: no turn runs elsewhere."""
        return False

    async def cancel_requests(self) -> AsyncIterator[tuple[str, str]]:
        """Nothing ever comes; waits until cancelled."""
        await asyncio.Event().wait()
        yield "", ""  # never reached: makes this an async generator

    async def submission_offers(self) -> AsyncIterator[None]:
        """Nothing ever comes (this process knows what it left unclaimed); waits until cancelled."""
        await asyncio.Event().wait()
        yield None  # never reached: makes this an async generator

    async def wait_for_events(self, request_id: str, after: int, timeout_seconds: float) -> bool:
        """False: no other process writes this file, so there is nothing to wait for."""
        return False

    # ------------------------------------------------------------------ internals

    async def _commit(self, what: str, program: Callable[[int], Program[T]], how: Commit = ALONE) -> T:
        """On the writer thread, always group-committed and in call order (so ``how.grouped``
        and ``how.conversation_id`` change nothing); ``how.urgent`` ends the writer's wait for
        more writes."""
        outcome: list[T] = []
        await self._writer.submit(
            lambda conn, now_us: outcome.append(run_program(conn, program(now_us))), what, urgent=how.urgent
        )
        return outcome[0]

    async def _read(self, what: str, sql: str, params: Sequence[Any]) -> list[Any]:
        try:
            return await self._open_reader(what).read(sql, params)
        except DB_ERRORS as exc:
            raise store_error(exc, what) from exc

    async def _read_together(
        self, what: str, statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[Any]]:
        try:
            return await self._open_reader(what).read_together(statements)
        except DB_ERRORS as exc:
            raise store_error(exc, what) from exc

    def _open_reader(self, what: str) -> Reader:
        if self._reader is None:
            raise StoreError(f"sqlite store: {what}: store is not open")
        return self._reader


def _with_history(program: Program[T], read: HistoryRead) -> Program[tuple[T, list[Any] | None]]:
    """``program`` (a turn's admission), then, in the same transaction, ``read``'s rows of the
    conversation's history when they are few: the messages changed since the version this
    process holds (``read.base``: only what was written since its last read), or a conversation
    this very transaction creates (its rows are the input). Otherwise None, and the caller reads
    on the reader's connection: a whole read of a long conversation (or of a fork with its
    sources) would hold up every other write. (A removal since the held version, a rollback's,
    makes even a held conversation's read whole, as on the reader: rare, one conversation.) The
    read costs the writer a few rows; it saves the turn a round trip to the reader's thread
    before its model call (issue 33, bench/ttft.md "the store's thread hops")."""
    if read.base is None:
        found = yield [Statement(_CONVERSATION_EXISTS, (read.conversation_id,), fetch=True)]
        if found[0]:
            return (yield from program), None
    result = yield from program
    rows = yield [Statement(read.sql, read.params, fetch=True)]
    return result, rows[0]


_CONVERSATION_EXISTS = "SELECT 1 FROM conversations WHERE id = ?"
