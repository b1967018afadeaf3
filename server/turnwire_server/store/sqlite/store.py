"""The SQLite store backend: one process, WAL mode, group-committed writes.

Two connections to one database file: a writer, a plain ``sqlite3`` connection
on its own thread that applies queued writes in call order and batches
everything pending into one transaction (group commit; see
:mod:`turnwire_server.store.sqlite.writer`), and a read-only aiosqlite reader. In WAL mode
the reader sees only committed data and never waits for the writer.

The schema lives in ``server/store/migrations/sqlite/NNNN_name.sql``; pending
migrations run at :meth:`SqliteStore.open` (see :mod:`turnwire_server.store.sqlite.migrations`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiosqlite
import filelock

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    CompactionRecord,
    SubmissionRecord,
    SubmissionState,
    ToolCallAnswer,
    TurnAdmission,
    TurnRecord,
    renewed_lease,
)
from turnwire_server.store.core import (
    compaction_writes,
    retention_writes,
    stream_writes,
    submission_writes,
    transcript_writes,
)
from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.message_cache import DecodedMessages
from turnwire_server.store.core.reads import CoreReads
from turnwire_server.store.core.rows import (
    TURN_COLUMNS,
    compaction_params,
    to_us,
    turn_from_row,
)
from turnwire_server.store.core.submission_rows import (
    SUBMISSION_COLUMNS,
    submission_from_row,
)
from turnwire_server.store.errors import StoreError, StoreInUse
from turnwire_server.store.sqlite.db import DB_ERRORS, DIALECT, run_program, store_error
from turnwire_server.store.sqlite.migrations import Migration, load_migrations
from turnwire_server.store.sqlite.submissions import (
    claim_submissions_write,
)
from turnwire_server.store.sqlite.writer import BUSY_TIMEOUT_MS, SqliteWriter
from turnwire_server.store.sqlite.writes import (
    claim_turns_write,
    finish_turn_write,
    renew_leases_write,
    roll_back_turn_write,
    save_message_write,
    start_turn_write,
)

__all__ = ["Migration", "SqliteStore", "load_migrations"]


def read_only_problem(path: Path) -> str | None:
    """Why the store at ``path`` cannot be written, or None. SQLite in WAL mode writes the file, its
    ``-wal`` and ``-shm`` files and the sidecar's ``.lock`` beside it, so both the file (when it
    exists) and its folder (the nearest existing one) must be writable; SQLite itself would only
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
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
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


class SqliteStore(CoreReads):
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

    def __init__(self, path: str | Path, *, checkpoint_batch_ms: float = 0) -> None:
        if str(path) in ("", ":memory:") or str(path).startswith("file:"):
            raise ValueError(f"SqliteStore needs a database file path, got {str(path)!r}")
        if checkpoint_batch_ms < 0:
            raise ValueError(f"checkpoint_batch_ms must be >= 0, got {checkpoint_batch_ms}")
        self._path = Path(path)
        # One server process per database file: its turn lock lives in the process.
        self._process_lock = filelock.FileLock(f"{self._path}.lock", timeout=0)
        self._writer = SqliteWriter(self._path, batch_s=checkpoint_batch_ms / 1000)
        self._reader_db: aiosqlite.Connection | None = None
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

        Raises :class:`StoreInUse`, or :class:`StoreError` when the file cannot be opened, a
        migration fails, or the database's schema is newer than this code knows. A no-op
        when already open; a closed store cannot be reopened (make a new one).
        """
        if self._opened:
            return
        if self._closing:
            raise StoreError("sqlite store: closed; create a new SqliteStore to reopen")
        if (problem := read_only_problem(self._path)) is not None:
            raise StoreError(problem)
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
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
        reader: aiosqlite.Connection | None = None
        try:
            reader = await aiosqlite.connect(self._path, isolation_level=None)
            await reader.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            await reader.execute("PRAGMA query_only=ON")
        except BaseException as exc:
            if reader is not None:
                with suppress(Exception):
                    await reader.close()
            with suppress(Exception):
                await self._writer.close()
            if isinstance(exc, DB_ERRORS):
                raise store_error(exc, f"opening {self._path}") from exc
            raise
        self._reader_db = reader
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
        reader, self._reader_db = self._reader_db, None
        if reader is not None:
            try:
                await reader.close()
            except DB_ERRORS as exc:
                errors.append(exc)
        self._process_lock.release()
        if errors:
            raise store_error(errors[0], f"closing {self._path}")

    # ------------------------------------------------------------------ reads

    async def discard_reply(self, turn: TurnRecord, message_id: str) -> None:
        """Remove the partial reply ``message_id`` and record ``turn``'s new reply id; see
        :meth:`~turnwire_server.store.base.Store.discard_reply`. Raises :class:`TurnNotFound`."""

        def discard(conn: sqlite3.Connection, now_us: int) -> None:
            run_program(conn, compaction_writes.discard_reply(turn, message_id, DIALECT, now_us))

        await self._writer.submit(discard, f"discard_reply({turn.request_id!r})", urgent=True)

    async def roll_back_turn(self, turn: TurnRecord, message_ids: Sequence[str]) -> None:
        """Remove the turn's messages and record its end, one transaction; see
        :meth:`~turnwire_server.store.base.Store.roll_back_turn`. Raises :class:`TurnNotFound`."""
        apply = roll_back_turn_write(turn, message_ids)
        try:
            await self._writer.submit(apply, f"roll_back_turn({turn.request_id!r})", urgent=True)
        finally:
            self._locks.drop(turn.request_id)

    async def save_compaction(self, record: CompactionRecord) -> None:
        """Replace the conversation's compaction (a no-op once the conversation is gone)."""
        params = compaction_params(record)

        def save(conn: sqlite3.Connection, _: int) -> None:
            run_program(conn, compaction_writes.save_compaction(record.conversation_id, params))

        await self._writer.submit(save, f"save_compaction({record.conversation_id!r})", urgent=True)

    async def claim_pending_submissions(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[SubmissionRecord]:
        """Claim up to ``limit`` pending submissions of other (dead: one process per file) owners."""
        claimed: list[list[str]] = []
        apply = claim_submissions_write(owner, to_us(lease_until, "lease_until"), limit, claimed.append)
        await self._writer.submit(apply, "claim_pending_submissions", urgent=True)
        if not claimed[-1]:
            return []
        marks = ", ".join("?" * len(claimed[-1]))
        rows = await self._read(
            "claim_pending_submissions",
            f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE id IN ({marks}) ORDER BY seq",
            claimed[-1],
        )
        return [submission_from_row(row) for row in rows]

    async def renew_leases(self, owner: str, until: dt.datetime) -> int:
        """Extend the leases of ``owner``'s running turns to ``until`` in one statement."""
        outcome: list[int] = []
        apply = renew_leases_write(owner, to_us(until, "until"), outcome.append)
        await self._writer.submit(apply, "renew_leases", urgent=False)
        return outcome[-1]

    async def claim_interrupted_turns(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[TurnRecord]:
        """Claim up to ``limit`` running turns of other (dead: one process per file) owners.

        ``now`` is not consulted: the process lock taken at :meth:`open` proves every other
        owner dead, so a lease that has not lapsed yet (a crash a moment ago) does not matter.
        """
        claimed: list[list[str]] = []
        apply = claim_turns_write(owner, to_us(lease_until, "lease_until"), limit, claimed.append)
        await self._writer.submit(apply, "claim_interrupted_turns", urgent=True)
        if not claimed[-1]:
            return []
        marks = ", ".join("?" * len(claimed[-1]))
        rows = await self._read(
            "claim_interrupted_turns",
            f"SELECT {TURN_COLUMNS} FROM turns WHERE request_id IN ({marks}) ORDER BY start_time, request_id",
            claimed[-1],
        )
        return [turn_from_row(row) for row in rows]

    # ------------------------------------------------------------------ one process per file

    async def request_cancel(self, request_id: str, *, stop: str = "") -> bool:
        """False: this store serves one process, so no turn runs elsewhere."""
        return False

    async def cancel_requests(self) -> AsyncIterator[tuple[str, str]]:
        """Nothing ever comes (one process per file); waits until cancelled."""
        await asyncio.Event().wait()
        yield "", ""  # never reached: makes this an async generator

    async def queue_head(self, conversation_id: str) -> str | None:
        """The holder of the conversation's in-process lock or the first in its line (a waiting
        turn or a submission's reserved place); see ``Store.queue_head``."""
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
        """A place in the in-process line (see ``Store.reserve_place``). Nothing is awaited, so
        the check of ``only_if_idle`` and the reservation are one step for this process's event
        loop; ``owner`` and ``lease_seconds`` do not apply (one process per file)."""
        head = self._locks.head(conversation_id)
        if only_if_idle and head is not None:
            return head
        self._locks.reserve(conversation_id, request_id, first=first)
        return None

    async def release_place(self, conversation_id: str, request_id: str) -> None:
        """Drop ``request_id``'s reserved place if no lock took it (see ``Store.release_place``)."""
        self._locks.drop(request_id)

    async def submission_offers(self) -> AsyncIterator[None]:
        """Nothing ever comes (one process per file: it knows what it left unclaimed); waits
        until cancelled."""
        await asyncio.Event().wait()
        yield None  # never reached: makes this an async generator

    async def wait_for_events(self, request_id: str, after: int, timeout_seconds: float) -> bool:
        """False: no other process writes this file, so there is nothing to wait for."""
        return False

    # ------------------------------------------------------------------ event streams

    async def append_events(
        self,
        conversation_id: str,
        request_id: str,
        events: Sequence[tuple[int, bytes]],
        *,
        ended: bool,
    ) -> None:
        """Store a batch of a turn's events (see ``Store.append_events``); group-committed with
        checkpoints, urgent when the batch ends the stream."""
        batch = stream_writes.prepare_events(events, ended=ended)

        def append(conn: sqlite3.Connection, now_us: int) -> None:
            run_program(
                conn, stream_writes.append_events(conversation_id, request_id, batch, DIALECT, now_us)
            )

        await self._writer.submit(
            append,
            f"append_events({request_id!r})",
            urgent=ended,
        )

    # ------------------------------------------------------------------ submissions

    async def create_submission(
        self, submission: SubmissionRecord, *, max_open: int
    ) -> tuple[SubmissionRecord, bool]:
        """Store a new submission or return the one it repeats (see ``Store.create_submission``)."""
        submission_writes.check_new(submission)
        outcome: list[tuple[SubmissionRecord, bool]] = []
        await self._writer.submit(
            lambda conn, _: outcome.append(
                run_program(conn, submission_writes.create_submission(submission, max_open))
            ),
            f"create_submission({submission.submission_id!r})",
            urgent=True,
        )
        record, created = outcome[-1]
        if created:  # its place in the conversation's line, taken at acceptance
            self._locks.reserve(record.conversation_id, record.submission_id)
        return record, created

    async def end_submission(
        self, submission_id: str, state: SubmissionState, error: bytes | None, *, only_from: Sequence[str]
    ) -> SubmissionRecord | None:
        """End the submission when its state is in ``only_from``; the record as stored afterwards."""
        submission_writes.check_end(state)
        allowed = tuple(only_from)
        outcome: list[SubmissionRecord | None] = []
        await self._writer.submit(
            lambda conn, now_us: outcome.append(
                run_program(
                    conn, submission_writes.end_submission(submission_id, state, error, allowed, now_us)
                )
            ),
            f"end_submission({submission_id!r})",
            urgent=True,
        )
        record = outcome[-1]
        if record is not None and record.state not in submission_writes.OPEN:
            self._locks.drop(submission_id)  # ended before its turn took the place
        return record

    async def expire_submissions(self, before: dt.datetime, limit: int, error: bytes) -> list[str]:
        """End up to ``limit`` pending submissions accepted before ``before`` as ``error``."""
        before_us = to_us(before, "before")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        outcome: list[list[str]] = []
        await self._writer.submit(
            lambda conn, now_us: outcome.append(
                run_program(
                    conn, submission_writes.expire_submissions(before_us, limit, error, DIALECT, now_us)
                )
            ),
            "expire_submissions",
            urgent=False,
        )
        for submission_id in outcome[-1]:
            self._locks.drop(submission_id)
        return outcome[-1]

    # ------------------------------------------------------------------ writes

    async def start_turn(self, turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> None:
        """Durably create the conversation if missing, append ``messages`` and insert ``turn``;
        returns None (the caller loads the history: see ``Store.start_turn``).

        One transaction, committed when this returns. ``messages`` get the next
        positions in order. Raises :class:`MessageIdConflict` (storing nothing)
        when a message id already exists in ``turn.conversation_id`` or repeats
        within ``messages``; :class:`TurnAlreadyExists` (a :class:`StoreError`)
        when ``turn.request_id`` already exists; :class:`ValueError` for a
        message without parts (never stored) or an invalid argument.
        """
        apply = start_turn_write(turn, messages)
        await self._writer.submit(apply, f"start_turn({turn.request_id!r})", urgent=True)

    async def save_message(
        self, conversation_id: str, message: message_pb2.Message, *, turn_request_id: str = ""
    ) -> None:
        """Insert ``message``, or replace the one with its id in place (same position).

        The checkpoint of a streaming reply: group-committed with other queued
        writes, applied in call order, committed when this returns. Creates the
        conversation if missing and bumps its update time. A message without
        parts is not stored (the call is a no-op), and neither is one whose
        ``turn_request_id`` names no recorded turn (its conversation was deleted).
        Raises :class:`ValueError` for an empty id or invalid create_time.
        """
        apply = save_message_write(conversation_id, message, turn_request_id)
        if apply is None:
            return
        what = f"save_message({conversation_id!r}, {message.id!r})"
        await self._writer.submit(apply, what, urgent=False)

    async def finish_turn(self, turn: TurnRecord, message: message_pb2.Message | None) -> None:
        """Durably upsert the assistant ``message`` and record ``turn``'s end.

        One transaction, committed when this returns. ``message`` (when given
        and it has parts; a message without parts is never stored) is inserted
        or replaced as by :meth:`save_message`. Updates the turn row's state,
        end_time, error and recovery_count. Raises :class:`TurnNotFound` (a
        :class:`StoreError`) when no turn ``turn.request_id`` exists (nothing is stored then).
        """
        apply = finish_turn_write(turn, message)
        try:
            await self._writer.submit(apply, f"finish_turn({turn.request_id!r})", urgent=True)
        finally:
            if turn.state != "running":  # an interrupted turn ended without a recovery run
                self._locks.drop(turn.request_id)

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        mode: AddMode,
        allow_missing: bool,
        replace_only: Collection[str] = (),
    ) -> AddResult:
        """Write ``messages`` into the transcript, one transaction, all or nothing; see
        :meth:`~turnwire_server.store.base.Store.add_messages` and
        :func:`~turnwire_server.store.core.transcript_writes.add_messages` for the rules and the
        errors (:class:`ConversationNotFound`, :class:`MessageIdConflict`,
        :class:`MessageBeingWritten`, :class:`UnknownMessage`, :class:`ValueError`)."""
        make = transcript_writes.adding(
            conversation_id, messages, mode=mode, allow_missing=allow_missing, replace_only=replace_only
        )
        outcome: list[AddResult] = []
        await self._writer.submit(
            lambda conn, now_us: outcome.append(run_program(conn, make(DIALECT, now_us))),
            f"add_messages({conversation_id!r})",
            urgent=True,
        )
        return outcome[0]

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete every row of the conversation (messages, parts, turns, turn streams and events,
        submissions) in one transaction; False when there was none."""
        outcome: list[bool] = []
        await self._writer.submit(
            lambda conn, _: outcome.append(
                run_program(conn, transcript_writes.delete_conversation(conversation_id, DIALECT))
            ),
            f"delete_conversation({conversation_id!r})",
            urgent=True,
        )
        self._locks.drop_all(conversation_id)  # the places of its deleted pending submissions
        return outcome[0]

    async def expire_events(self, before: dt.datetime, limit: int) -> int:
        """Delete the events of up to ``limit`` (>= 1) streams that ended before ``before`` and
        mark them ``events_expired``, in one transaction; returns how many streams. Raises
        :class:`ValueError` for a naive ``before`` or ``limit`` < 1."""
        outcome: list[int] = []
        program = retention_writes.expire_events(to_us(before, "before"), limit)
        await self._writer.submit(
            lambda conn, _: outcome.append(run_program(conn, program(DIALECT))), "expire_events", urgent=False
        )
        return outcome[0]

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        """Record the client's answers to waiting tool calls in one read-modify-write on the writer
        thread (see :meth:`Store.answer_tool_calls`), committed when this returns.

        Raises what that method documents, storing nothing then.
        """
        batch = transcript_writes.prepare_answers(answers)
        outcome: list[AnsweredToolCalls] = []
        await self._writer.submit(
            lambda conn, now_us: outcome.append(
                run_program(
                    conn,
                    transcript_writes.answer_tool_calls(
                        conversation_id, batch, expired_before, DIALECT, now_us
                    ),
                )
            ),
            f"answer_tool_calls({conversation_id!r})",
            urgent=True,
        )
        return outcome[0]

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        """Close every call waiting for the client whose message was created before ``cutoff``
        (timezone-aware) with an errored result naming the expiry; returns how many. One write.

        Raises :class:`ValueError` for a naive ``cutoff``.
        """
        cutoff_us = to_us(cutoff, "cutoff")
        outcome: list[int] = []
        await self._writer.submit(
            lambda conn, now_us: outcome.append(
                run_program(conn, transcript_writes.expire_pending_tool_calls(cutoff_us, DIALECT, now_us))
            ),
            "expire_pending_tool_calls",
            urgent=True,
        )
        return outcome[0]

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
    ) -> AsyncIterator[TurnAdmission]:
        """:meth:`turn_lock`, then :meth:`start_turn` in it (see ``Store.admit_turn``): the lock is
        in the process, so only the commit reaches the database; nothing is read with it (a
        read in the single writer's transaction would hold up every other write)."""
        queued(True)
        async with self.turn_lock(turn.conversation_id, request_id=turn.request_id, first=first):
            queued(False)
            await self.start_turn(renewed_lease(turn, lease_seconds), messages)
            yield TurnAdmission()

    def turn_lock(
        self,
        conversation_id: str,
        *,
        request_id: str = "",
        owner: str = "",
        lease_seconds: float = 30.0,
        first: bool = False,
    ) -> AbstractAsyncContextManager[None]:
        """Hold the conversation's in-process turn lock (FIFO, or ``first`` in line; see
        :class:`LocalTurnLocks`), from the place a submission ``request_id`` reserved at
        acceptance if it did; one process per file, so owner and lease are not needed."""
        return self._locks.hold(conversation_id, request_id, first=first)

    # ------------------------------------------------------------------ internals

    async def _read(self, what: str, sql: str, params: Iterable[Any]) -> list[Any]:
        db = self._reader_db
        if db is None:
            raise StoreError(f"sqlite store: {what}: store is not open")
        try:
            return list(await db.execute_fetchall(sql, params))
        except DB_ERRORS as exc:
            raise store_error(exc, what) from exc
