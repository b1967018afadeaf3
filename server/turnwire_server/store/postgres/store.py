"""The PostgreSQL store backend: psycopg 3 (async) with a bounded connection pool.

Same behaviour as the SQLite store (:mod:`turnwire_server.store.sqlite`): every write that
SQLite applies as one write is one transaction here (:mod:`turnwire_server.store.postgres.writes`
holds the SQL), reads are single statements (one snapshot each), the page tokens are the
SQLite store's encoders, and undecodable data is :class:`StoreCorrupted`.

The schema lives in ``migrations/postgres/NNNN_name.sql``; pending migrations run at
:meth:`PostgresStore.open` in one transaction under an advisory lock
(:mod:`turnwire_server.store.postgres.migrations`), so replicas may start together.

**Several replicas share one database.** The turn lock is a cross-replica FIFO queue, cancel
requests and event wake-ups travel by ``LISTEN``/``NOTIFY``, and turn leases let a survivor
claim the turns of a replica that died (:mod:`turnwire_server.store.postgres.replicas`). The
store's writes are safe under concurrency (conversation locks, ``SELECT … FOR UPDATE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

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
    message_writes,
    retention_writes,
    stream_writes,
    submission_writes,
    transcript_writes,
    turn_writes,
)
from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.message_cache import DecodedMessages
from turnwire_server.store.core.reads import LOAD_COMPACTION_SQL, CoreReads
from turnwire_server.store.core.rows import (
    TURN_COLUMNS,
    compaction_from_row,
    compaction_params,
    to_us,
    turn_from_row,
)
from turnwire_server.store.core.submission_rows import (
    SUBMISSION_COLUMNS,
    submission_from_row,
)
from turnwire_server.store.core.turn_writes import StartTurn, prepare_start_turn
from turnwire_server.store.errors import StoreError
from turnwire_server.store.metrics import COMMIT_DURATION
from turnwire_server.store.postgres import db, turn_queue, writes
from turnwire_server.store.postgres.db import DIALECT, Conn, run_program
from turnwire_server.store.postgres.migrations import apply_migrations, load_migrations
from turnwire_server.store.postgres.replicas import CANCEL_CHANNEL, EVENTS_CHANNEL, QUEUE_CHANNEL, Listener
from turnwire_server.store.postgres_url import PostgresTarget, parse_postgres_url

__all__ = ["DEFAULT_POOL_SIZE", "PostgresStore"]

DEFAULT_POOL_SIZE: Final = 10
"""Connections the pool holds at most unless configured (``store.pool_size``)."""

_CONNECT_TIMEOUT_S: Final = 10.0
log = logging.getLogger("turnwire_server.store.postgres")
_SINGLE_COMMITS = COMMIT_DURATION.labels("postgresql", "single")
_GROUP_COMMITS = COMMIT_DURATION.labels("postgresql", "group")

_CHECK_IDLE_S: Final = 2.0
"""A pooled connection idle longer than this is checked (one round trip) before it is handed
out; one back from use more recently is not, so the hot path pays no check per statement."""

_RETRIES: Final = 5
"""Attempts of a transaction that lost a race the database resolved by aborting it
(serialization failure, deadlock, a concurrent insert of the same key)."""
_RACE_ERRORS: Final = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.UniqueViolation)

T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class _Queued:
    """A write waiting for the next group commit."""

    conversation_id: str
    what: str
    body: Callable[[Any, int], Awaitable[None]]
    future: asyncio.Future[None]


class PostgresStore(CoreReads):
    """:class:`~turnwire_server.store.base.Store` on a PostgreSQL database (psycopg 3, async).

    ``url`` is ``postgresql://user[:password]@host[:port]/database`` (or ``postgres://``; libpq
    query parameters pass through); ``password_env`` names an environment variable with the
    password when the URL has none (else libpq's ``PGPASSWORD``). ``pool_size`` (>= 1) bounds
    the connections the store holds; a call waits up to ``timeout_s`` seconds for one.

    Errors: :class:`StoreError` when the database cannot be reached or fails (its message
    names the URL with the password masked, never the password), :class:`StoreCorrupted` for
    stored data that cannot be decoded, the domain errors of
    :mod:`turnwire_server.store.base` as the SQLite store raises them, and
    :class:`ValueError` for a malformed URL (at construction) or an argument no backend could
    store. Besides the pool, the store holds one ``LISTEN`` connection.
    """

    _store_name = "postgres"
    _text_holds_nul = False

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        password_env: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self._target: PostgresTarget = parse_postgres_url(url, password_env=password_env)
        self._pool_size = pool_size
        self._timeout_s = timeout_s
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._closed = False
        # Decoded messages reused between a conversation's reads (issue 17).
        self._decoded = DecodedMessages("postgres")
        self._tickets = LocalTurnLocks()  # this process's tickets of a conversation go in call order
        self._batch: list[_Queued] = []
        self._flusher: asyncio.Task[None] | None = None
        self._listener = Listener(self._listen_connection)
        # Writes of one conversation are applied in call order (Store: checkpoints are applied in
        # call order): taken before the first await, FIFO, so concurrent calls keep their order.
        self._write_order = LocalTurnLocks()
        self._last_us = 0
        self._returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def connection_info(self) -> tuple[tuple[str], dict[str, Any]]:
        """``(args, kwargs)`` for ``psycopg.AsyncConnection.connect`` to this store's database (a
        connection of the caller's own, e.g. to copy data in); the password stays in ``kwargs``."""
        return (self._target.conninfo,), self._connect_kwargs()

    def redact(self, text: str) -> str:
        """``text`` with this store's password masked."""
        return self._target.redact_text(text)

    @property
    def display_url(self) -> str:
        """The store URL with its password masked (for messages)."""
        return self._target.display

    # ------------------------------------------------------------------ lifecycle

    def _connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": int(_CONNECT_TIMEOUT_S)}
        if self._target.password is not None:
            kwargs["password"] = self._target.password
        return kwargs

    async def migrate(self) -> list[str]:
        """Apply pending migrations on a connection of its own (not the pool) and return the names
        applied ([] when the schema is current). Used by :meth:`open` and ``turnwire migrate``.

        Raises :class:`StoreError` when the database cannot be reached, a migration fails, or
        the database's schema is newer than this code knows.
        """
        try:
            conn = await psycopg.AsyncConnection.connect(self._target.conninfo, **self._connect_kwargs())
        except psycopg.Error as exc:
            raise self._error(exc, "connecting") from None
        try:
            return await apply_migrations(
                conn, load_migrations(), where=self._target.display, now_us=self._now_us()
            )
        except psycopg.Error as exc:
            raise self._error(exc, "migrating") from None
        finally:
            await conn.close()

    async def open(self) -> None:
        """Connect, run pending migrations (one transaction under an advisory lock, so replicas
        starting together do not race), then open the connection pool.

        Raises :class:`StoreError` when the database cannot be reached, a migration fails, or
        the database's schema is newer than this code knows. A no-op when already open; a closed
        store cannot be reopened.
        """
        if self._pool is not None:
            return
        if self._closed:
            raise StoreError("postgres store: closed; create a new PostgresStore to reopen")
        await self.migrate()
        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            self._target.conninfo,
            kwargs=self._connect_kwargs(),
            min_size=1,
            max_size=self._pool_size,
            timeout=self._timeout_s,
            check=self._check_idle,
            reset=self._stamp_returned,
            name="turnwire-store",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=_CONNECT_TIMEOUT_S)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await pool.close()
            raise self._error(exc, "opening the connection pool") from None
        self._pool = pool
        self._listener.start()

    async def _stamp_returned(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Pool ``reset`` callback: when ``conn`` came back (healthy) from use."""
        self._returned[conn] = time.monotonic()

    async def _check_idle(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Pool ``check`` callback: a connection idle for a while (a restarted server, a firewall
        may have dropped it) is checked with a round trip; raising makes the pool replace it."""
        returned = self._returned.get(conn)
        if returned is None or time.monotonic() - returned > _CHECK_IDLE_S:
            await psycopg_pool.AsyncConnectionPool.check_connection(conn)

    async def _listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own for ``LISTEN`` (not from the pool)."""
        return await psycopg.AsyncConnection.connect(self._target.conninfo, **self._connect_kwargs())

    async def close(self) -> None:
        """Close the pool (waiting for connections in use to come back). Idempotent."""
        self._closed = True
        await self._listener.stop()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # ------------------------------------------------------------------ internals

    def _now_us(self) -> int:
        """The write's time (µs since the epoch), strictly increasing within this store."""
        now = time.time_ns() // 1000
        self._last_us = now if now > self._last_us else self._last_us + 1
        return self._last_us

    def _error(self, exc: BaseException, what: str) -> StoreError:
        """``exc`` as a :class:`StoreError` naming ``what`` and the (redacted) URL."""
        if isinstance(exc, StoreError):
            return exc
        if isinstance(exc, psycopg_pool.PoolTimeout):
            detail = f"no database connection within {self._timeout_s:g} s (pool of {self._pool_size})"
        else:
            sqlstate = getattr(exc, "sqlstate", None)
            text = str(exc).strip() or type(exc).__name__
            detail = f"{sqlstate}: {text}" if sqlstate else text
        message = self._target.redact_text(f"postgres store {self._target.display}: {what} failed: {detail}")
        err = StoreError(message)
        err.__cause__ = None
        return err

    def _require_pool(self, what: str) -> psycopg_pool.AsyncConnectionPool[Any]:
        pool = self._pool
        if pool is None:
            raise StoreError(f"postgres store: {what}: store is not open")
        return pool

    async def _read(self, what: str, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        pool = self._require_pool(what)
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(db.native(sql), params)
                return list(await cur.fetchall())
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._error(exc, what) from None

    async def _write(
        self,
        what: str,
        body: Callable[[Conn, int], Awaitable[T]],
        *,
        conversation_id: str | None = None,
        pipeline: bool = False,
        then: Callable[[T], Awaitable[T]] | None = None,
    ) -> T:
        """Run ``body(conn, now_us)`` in one transaction, committed when this returns; retried
        (from the start) when the database aborted it to resolve a race. Domain errors raised
        by ``body`` roll back and propagate as they are. Writes naming the same
        ``conversation_id`` are applied in call order. ``pipeline``: the transaction runs in
        pipeline mode (``BEGIN`` and statements whose results ``body`` does not wait for cost
        no round trip of their own)."""
        pool = self._require_pool(what)
        if conversation_id is None:
            return await self._transaction(pool, what, body, pipeline, then)
        async with self._write_order.hold(conversation_id):
            return await self._transaction(pool, what, body, pipeline, then)

    async def _transaction(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        what: str,
        body: Callable[[Conn, int], Awaitable[T]],
        pipeline: bool = False,
        then: Callable[[T], Awaitable[T]] | None = None,
    ) -> T:
        for attempt in range(_RETRIES):
            try:
                async with pool.connection() as conn:
                    started = time.perf_counter()
                    try:
                        async with db.transaction(conn, pipeline):
                            result = await body(conn, self._now_us())
                    except psycopg.Error:
                        if pipeline:
                            await db.discard(conn)
                        raise
                    _SINGLE_COMMITS.observe(time.perf_counter() - started)
                    # Committed, still on its connection: ``then`` reads what the last flight
                    # brought back (a pipelined read sent with the COMMIT costs no round trip).
                    return result if then is None else await then(result)
            except _RACE_ERRORS as exc:
                if attempt + 1 == _RETRIES:
                    raise self._error(exc, what) from None
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise self._error(exc, what) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _write_batched(
        self, what: str, body: Callable[[Conn, int], Awaitable[None]], *, conversation_id: str
    ) -> None:
        """Group commit (as the SQLite writer does): ``body`` joins the writes queued meanwhile in
        one transaction, each under its own savepoint (one failing undoes only itself); returns
        once that transaction committed. For the hot, non-urgent writes (checkpoints, event
        batches): with a hundred turns streaming, one commit serves many of them."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batch.append(_Queued(conversation_id, what, body, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_batches(), name="postgres group commit")
        await future

    async def _flush_batches(self) -> None:
        while self._batch:
            # Stable sort: call order within a conversation, one lock order for every replica's
            # batches (two batches taking conversation locks in other orders could deadlock).
            batch, self._batch = sorted(self._batch, key=lambda q: q.conversation_id), []
            await self._apply_batch(batch)

    async def _apply_batch(self, batch: list[_Queued]) -> None:
        outcomes: list[BaseException | None] = []
        failure: BaseException | None = None
        for _ in range(_RETRIES):
            outcomes = []
            try:
                pool = self._require_pool("group commit")
                async with pool.connection() as conn:
                    started = time.perf_counter()
                    applied = await self._apply_pipelined(conn, batch)
                if applied:
                    outcomes = [None] * len(batch)
                else:
                    async with pool.connection() as conn:
                        outcomes = await self._apply_one_by_one(conn, batch)
                _GROUP_COMMITS.observe(time.perf_counter() - started)
                failure = None
                break
            except _RACE_ERRORS as exc:
                failure = self._error(exc, "group commit")
            except (psycopg.Error, psycopg_pool.PoolTimeout, StoreError) as exc:
                failure = self._error(exc, "group commit")
                break
        for index, queued in enumerate(batch):
            if queued.future.done():
                continue
            outcome = failure if failure is not None else outcomes[index]
            if outcome is None:
                queued.future.set_result(None)
            else:
                queued.future.set_exception(outcome)

    async def _apply_pipelined(self, conn: Conn, batch: list[_Queued]) -> bool:
        """The batch in one pipelined transaction without a savepoint per write (they cost a
        round trip each): statements go out without waiting, only reads do. True when it
        committed; False when some write failed (all rolled back: the caller applies them again
        one by one, on another connection: this one is discarded). Raises the race errors (the
        whole batch again)."""
        try:
            async with (
                db.flight(conn),
                db.conversations_locked(conn, (q.conversation_id for q in batch)),
            ):
                now_us = self._now_us()
                for queued in batch:
                    await queued.body(conn, now_us)
        except _RACE_ERRORS:
            await db.discard(conn)
            raise
        except (psycopg.Error, StoreError, ValueError):
            if conn.closed:
                raise
            await db.discard(conn)
            return False
        return True

    async def _apply_one_by_one(self, conn: Conn, batch: list[_Queued]) -> list[BaseException | None]:
        """The batch in one transaction, a savepoint per write (one failing undoes only itself);
        each write's outcome. Raises the race errors (the whole batch again)."""
        outcomes: list[BaseException | None] = []
        async with conn.transaction():
            now_us = self._now_us()
            for queued in batch:
                try:
                    async with conn.transaction():  # a savepoint per write
                        await queued.body(conn, now_us)
                    outcomes.append(None)
                except _RACE_ERRORS:
                    raise
                except (psycopg.Error, StoreError, ValueError) as error:
                    outcomes.append(
                        self._error(error, queued.what) if isinstance(error, psycopg.Error) else error
                    )
        return outcomes

    # ------------------------------------------------------------------ reads

    async def discard_reply(self, turn: TurnRecord, message_id: str) -> None:
        """Remove the partial reply ``message_id`` and record ``turn``'s new reply id, one
        transaction; see :meth:`~turnwire_server.store.base.Store.discard_reply`. Raises
        :class:`TurnNotFound`."""
        await self._write(
            f"discard_reply({turn.request_id!r})",
            lambda conn, now_us: run_program(
                conn, compaction_writes.discard_reply(turn, message_id, DIALECT, now_us)
            ),
            conversation_id=turn.conversation_id,
        )

    async def save_compaction(self, record: CompactionRecord) -> None:
        """Replace the conversation's compaction (a no-op once the conversation is gone)."""
        params = compaction_params(record)  # invalid values fail here, before a connection is taken
        await self._write(
            f"save_compaction({record.conversation_id!r})",
            lambda conn, _: run_program(
                conn, compaction_writes.save_compaction(record.conversation_id, params)
            ),
            conversation_id=record.conversation_id,
        )

    # ------------------------------------------------------------------ event streams

    async def append_events(
        self,
        conversation_id: str,
        request_id: str,
        events: Sequence[tuple[int, bytes]],
        *,
        ended: bool,
    ) -> None:
        """Store a batch of a turn's events (see ``Store.append_events``), one transaction.

        Raises :class:`ValueError` for an empty batch without ``ended`` or sequence numbers
        that do not ascend from >= 1."""
        batch = stream_writes.prepare_events(events, ended=ended)

        async def append(conn: Conn, now_us: int) -> None:
            program = stream_writes.append_events(conversation_id, request_id, batch, DIALECT, now_us)
            if await run_program(conn, program):
                # Readers following this turn from another replica woken (delivered at commit).
                await conn.execute(b"SELECT pg_notify('turnwire_events', %s)", (request_id,))

        # Group-committed, the stream's end too (its turn waits for it, but shares the commit).
        await self._write_batched(
            f"append_events({request_id!r})",
            append,
            conversation_id=conversation_id,
        )

    # ------------------------------------------------------------------ submissions

    async def create_submission(
        self, submission: SubmissionRecord, *, max_open: int
    ) -> tuple[SubmissionRecord, bool]:
        """Store a new submission or return the one it repeats (see ``Store.create_submission``).
        Raises :class:`ValueError` for a submission that is not ``pending``."""
        submission_writes.check_new(submission)

        async def create(conn: Conn, now_us: int) -> tuple[SubmissionRecord, bool]:
            await writes.lock_submissions(conn)
            record, created = await run_program(
                conn, submission_writes.create_submission(submission, max_open)
            )
            if created:
                await writes.queue_submission(conn, submission)
            return record, created

        return await self._write(f"create_submission({submission.submission_id!r})", create)

    async def end_submission(
        self, submission_id: str, state: SubmissionState, error: bytes | None, *, only_from: Sequence[str]
    ) -> SubmissionRecord | None:
        """End the submission when its state is in ``only_from``; the record as stored afterwards.
        Raises :class:`ValueError` for an unknown ``state``."""
        submission_writes.check_end(state)
        allowed = tuple(only_from)

        async def end(conn: Conn, now_us: int) -> SubmissionRecord | None:
            program = submission_writes.end_submission(submission_id, state, error, allowed, now_us)
            record = await run_program(conn, program)
            if record is not None and record.state not in submission_writes.OPEN:
                await writes.free_unowned_tickets(conn, [submission_id])
            return record

        return await self._write(f"end_submission({submission_id!r})", end)

    async def expire_submissions(self, before: dt.datetime, limit: int, error: bytes) -> list[str]:
        """End up to ``limit`` (>= 1) pending submissions accepted before ``before`` as ``error``."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        before_us = to_us(before, "before")

        async def expire(conn: Conn, now_us: int) -> list[str]:
            program = submission_writes.expire_submissions(before_us, limit, error, DIALECT, now_us)
            ids = await run_program(conn, program)
            await writes.free_unowned_tickets(conn, ids)
            return ids

        return await self._write("expire_submissions", expire)

    # ------------------------------------------------------------------ turn writes

    async def start_turn(
        self, turn: TurnRecord, messages: Sequence[message_pb2.Message]
    ) -> list[message_pb2.Message]:
        """Durably create the conversation if missing, append ``messages`` and insert ``turn``;
        one transaction, committed when this returns (rules and errors: ``Store.start_turn``
        and :meth:`SqliteStore.start_turn <turnwire_server.store.sqlite.SqliteStore.start_turn>`).
        Returns the conversation's messages as that transaction left them, read in the same flight
        as its commit."""
        start = prepare_start_turn(turn, messages)
        conversation_id = turn.conversation_id

        async def body(conn: Conn, now_us: int) -> Any:
            await run_program(conn, turn_writes.start_turn(start, DIALECT, now_us))
            # Sent with the writes, answered with the COMMIT: the history costs no round trip.
            read = self._decoded.read(conversation_id)
            return read, await conn.execute(read.sql.encode(), read.params)

        async def history(sent: Any) -> Any:
            read, cursor = sent
            return self._decoded.messages(read, await cursor.fetchall())

        # On the hot path (a turn waits for this commit before its model call): pipelined, so it
        # costs two round trips, the reads and the commit (with the history).
        result: list[message_pb2.Message] = await self._write(
            f"start_turn({turn.request_id!r})",
            body,
            conversation_id=conversation_id,
            pipeline=True,
            then=history,
        )
        return result

    async def save_message(
        self, conversation_id: str, message: message_pb2.Message, *, turn_request_id: str = ""
    ) -> None:
        """Insert ``message`` or replace the one with its id in place; a no-op for a message
        without parts or when ``turn_request_id`` names no recorded turn. Raises
        :class:`ValueError` for an empty id or invalid create_time."""
        row = message_writes.prepare_save_message(message)
        if row is None:
            return
        await self._write_batched(
            f"save_message({conversation_id!r}, {message.id!r})",
            lambda conn, now_us: run_program(
                conn, message_writes.save_message(conversation_id, row, turn_request_id, DIALECT, now_us)
            ),
            conversation_id=conversation_id,
        )

    async def finish_turn(self, turn: TurnRecord, message: message_pb2.Message | None) -> None:
        """Durably upsert the assistant ``message`` (when it has parts) and record ``turn``'s end,
        one transaction. Raises :class:`TurnNotFound` (storing nothing) when no turn
        ``turn.request_id`` exists."""
        finish = message_writes.prepare_finish_turn(turn, message)
        # Group-committed with the checkpoints and event batches queued meanwhile (as SQLite's
        # writer does): the turn waits for this commit before its TurnEnd, but shares it.
        await self._write_batched(
            f"finish_turn({turn.request_id!r})",
            lambda conn, now_us: run_program(conn, message_writes.finish_turn(finish, DIALECT, now_us)),
            conversation_id=turn.conversation_id,
        )

    # ------------------------------------------------------------------ transcript, retention

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        mode: AddMode,
        allow_missing: bool,
        replace_only: Collection[str] = (),
    ) -> AddResult:
        """Write ``messages`` into the transcript, one transaction, all or nothing (rules and
        errors: ``Store.add_messages``)."""
        make = transcript_writes.adding(
            conversation_id, messages, mode=mode, allow_missing=allow_missing, replace_only=replace_only
        )
        return await self._write(
            f"add_messages({conversation_id!r})",
            lambda conn, now_us: run_program(conn, make(DIALECT, now_us)),
            conversation_id=conversation_id,
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete every row of the conversation in one transaction; False when there was none."""
        return await self._write(
            f"delete_conversation({conversation_id!r})",
            lambda conn, _: run_program(
                conn, transcript_writes.delete_conversation(conversation_id, DIALECT)
            ),
            conversation_id=conversation_id,
        )

    async def expire_events(self, before: dt.datetime, limit: int) -> int:
        """Delete the events of up to ``limit`` (>= 1) streams that ended before ``before`` and
        mark them ``events_expired``, one transaction; returns how many streams."""
        program = retention_writes.expire_events(to_us(before, "before"), limit)
        return await self._write("expire_events", lambda conn, _: run_program(conn, program(DIALECT)))

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        """Record the client's answers in one read-modify-write transaction holding the
        conversation's row and message rows ``FOR UPDATE`` (see ``Store.answer_tool_calls``)."""
        batch = transcript_writes.prepare_answers(answers)
        return await self._write(
            f"answer_tool_calls({conversation_id!r})",
            lambda conn, now_us: run_program(
                conn,
                transcript_writes.answer_tool_calls(conversation_id, batch, expired_before, DIALECT, now_us),
            ),
            conversation_id=conversation_id,
        )

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        """Close every call waiting for the client whose message was created before ``cutoff``
        (tz-aware) with an errored result naming the expiry; returns how many. One transaction."""
        cutoff_us = to_us(cutoff, "cutoff")
        return await self._write(
            "expire_pending_tool_calls",
            lambda conn, now_us: run_program(
                conn, transcript_writes.expire_pending_tool_calls(cutoff_us, DIALECT, now_us)
            ),
        )

    # ------------------------------------------------------------------ replicas

    def turn_lock(
        self,
        conversation_id: str,
        *,
        request_id: str = "",
        owner: str = "",
        lease_seconds: float = 30.0,
        first: bool = False,
    ) -> AbstractAsyncContextManager[None]:
        """Hold the conversation's turn lock across replicas: a ticket in ``turn_queue``, held once
        it is the conversation's lowest live ticket (see
        :mod:`turnwire_server.store.postgres.replicas`). Raises :class:`StoreError` when the
        database fails while taking or waiting for it. ``first`` takes a ticket right behind the
        head and the tickets taken first before it (``turn_queue.TAKE_TICKET``), ahead of the rest; when the
        head's block of numbers has no room left (or the head is a ticket of schema 4), the ticket
        queues at the back."""
        return self._queue_lock(conversation_id, request_id, owner, lease_seconds, first)

    @contextlib.asynccontextmanager
    async def _queue_lock(
        self, conversation_id: str, request_id: str, owner: str, lease_seconds: float, first: bool
    ) -> AsyncIterator[None]:
        lease_us = int(lease_seconds * 1_000_000)
        async with self._tickets.hold(conversation_id):  # this process's tickets in call order
            ticket, head = await self._enqueue(conversation_id, request_id, owner, lease_us, first)
        async with self._held(conversation_id, ticket, head, lease_seconds):
            yield

    async def _enqueue(
        self, conversation_id: str, request_id: str, owner: str, lease_us: int, first: bool
    ) -> tuple[int, int]:
        """:meth:`_take_ticket`; a caller cancelled meanwhile gives the ticket up once it exists
        (or it would hold the conversation for as long as this replica renews its leases)."""
        taking = asyncio.ensure_future(self._take_ticket(conversation_id, request_id, owner, lease_us, first))
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                taken, _ = await taking
                await asyncio.shield(self._release(conversation_id, taken))
            raise

    @contextlib.asynccontextmanager
    async def _held(
        self, conversation_id: str, ticket: int, head: int | None, lease_seconds: float
    ) -> AsyncIterator[None]:
        """Wait until ``ticket`` heads the conversation's queue (``head`` as last seen), hold it,
        release it on exit (also when cancelled while waiting)."""
        lease_us = int(lease_seconds * 1_000_000)
        try:
            while head != ticket:
                with self._listener.waiting(QUEUE_CHANNEL, conversation_id) as moved:
                    head = await self._head(conversation_id, lease_us)
                    if head == ticket:
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(lease_seconds / 3, 0.05)):
                            await moved.wait()
            yield
        finally:
            # Shielded: a cancelled turn must still give the lock up.
            await asyncio.shield(self._release(conversation_id, ticket))

    def admit_turn(
        self,
        turn: TurnRecord,
        messages: Sequence[message_pb2.Message],
        *,
        lease_seconds: float,
        read_compaction: bool,
        queued: Callable[[bool], None],
        first: bool = False,
    ) -> AbstractAsyncContextManager[TurnAdmission]:
        """Take the turn's ticket and, when it heads the queue, start the turn, in one transaction
        sent in one flight (see ``Store.admit_turn``); else (turns ahead, or the input needs
        :meth:`start_turn`'s checks: a retried request id, a re-sent message, a submission no
        longer pending) wait in line, then :meth:`start_turn`. Raises :class:`ValueError` for
        an invalid turn or message (before anything is sent), and what :meth:`start_turn` and
        :meth:`turn_lock` raise; ``first`` as :meth:`turn_lock` (the one flight needs no order:
        it succeeds only at the head)."""
        start = prepare_start_turn(turn, messages)
        return self._admit(
            turn, messages, start, lease_seconds, read_compaction=read_compaction, queued=queued, first=first
        )

    @contextlib.asynccontextmanager
    async def _admit(
        self,
        turn: TurnRecord,
        messages: Sequence[message_pb2.Message],
        start: StartTurn,
        lease_seconds: float,
        *,
        read_compaction: bool,
        queued: Callable[[bool], None],
        first: bool,
    ) -> AsyncIterator[TurnAdmission]:
        conversation_id, request_id, owner = turn.conversation_id, turn.request_id, turn.owner
        lease_us = int(lease_seconds * 1_000_000)
        async with self._tickets.hold(conversation_id):  # this process's tickets in call order
            flight = asyncio.ensure_future(self._admit_flight(turn, start, lease_us, read_compaction))
            try:
                admitted = await asyncio.shield(flight)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    if (done := await flight) is not None:
                        await asyncio.shield(self._release(conversation_id, done[0]))
                raise
            if admitted is None:
                queued(True)
                ticket, head = await self._enqueue(conversation_id, request_id, owner, lease_us, first)
        if admitted is not None:
            ticket, admission = admitted
            try:
                yield admission
            finally:
                await asyncio.shield(self._release(conversation_id, ticket))
            return
        async with self._held(conversation_id, ticket, head, lease_seconds):
            queued(False)
            history = await self.start_turn(renewed_lease(turn, lease_seconds), messages)
            yield TurnAdmission(history=history)

    async def _admit_flight(
        self, turn: TurnRecord, start: StartTurn, lease_us: int, read_compaction: bool
    ) -> tuple[int, TurnAdmission] | None:
        """The one-flight admission: ``BEGIN``, the conversation's write lock, the queue lock, the
        ticket (failing the transaction unless it heads the queue), the input's writes
        (:func:`~turnwire_server.store.postgres.writes.start_new_turn`, failing it in the
        uncommon cases), the history and compaction reads, ``COMMIT``, sent together; the server
        is waited for once. Returns the ticket and what was read; None when the transaction
        failed (nothing stored, no ticket taken: the caller takes the waiting path, which also
        reports a database that is down)."""
        conversation_id = turn.conversation_id
        now_us = self._now_us()
        params = {
            "owner": turn.owner,
            "until": now_us + lease_us,
            "c": conversation_id,
            "r": turn.request_id,
            "stale": now_us - lease_us,
        }
        pool = self._require_pool("admit_turn")
        try:
            async with pool.connection() as conn:
                started = time.perf_counter()
                try:
                    # The write lock first, then the queue lock: taking a ticket never waits for
                    # a write (QUEUE_LOCK_CLASS), so no transaction holds them the other way round.
                    async with db.flight(conn), db.conversations_locked(conn, (conversation_id,)):
                        await conn.execute(
                            b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                            (writes.QUEUE_LOCK_CLASS, conversation_id),
                        )
                        ticket = await conn.execute(turn_queue.TAKE_TICKET_AT_HEAD, params)
                        await writes.start_new_turn(conn, start, now_us)
                        read = self._decoded.read(conversation_id)
                        history = await conn.execute(read.sql.encode(), read.params)
                        compaction = None
                        if read_compaction:
                            compaction = await conn.execute(_LOAD_COMPACTION, (conversation_id,))
                except psycopg.Error:
                    await db.discard(conn)
                    return None
                _SINGLE_COMMITS.observe(time.perf_counter() - started)
                taken = int((await ticket.fetchall())[0][0])
                stored = self._decoded.messages(read, await history.fetchall())
                record = None
                if compaction is not None and (found := await compaction.fetchall()):
                    record = compaction_from_row(found[0])
        except (psycopg.Error, psycopg_pool.PoolTimeout):
            return None
        return taken, TurnAdmission(stored, record, compaction_read=read_compaction)

    async def _take_ticket(
        self, conversation_id: str, request_id: str, owner: str, lease_us: int, first: bool = False
    ) -> tuple[int, int]:
        """Take (or, for work taken over from a dead replica, re-own) the ticket of
        ``request_id``; returns it and the conversation's head ticket. One round trip (one
        simple query, its statements one implicit transaction), so an idle conversation costs one
        before the turn's input is stored.

        Takers of one conversation serialize on its queue lock: a ticket is numbered and
        committed before the next taker looks, so no two takers both find themselves at the head
        and ticket order is commit order (first in, first out), except that a ``first`` ticket
        takes the free number right behind the head (and the ``first`` tickets before it)."""
        now_us = self._now_us()
        stale_us = now_us - lease_us
        pool = self._require_pool("turn_lock")
        params = {
            "lock": writes.QUEUE_LOCK_CLASS,
            "owner": owner,
            "until": now_us + lease_us,
            "c": conversation_id,
            "r": request_id,
            "stale": stale_us,
            "first": first,
        }
        try:
            async with pool.connection() as conn:
                # The statements in one simple query (client-side binding): one round trip, one
                # implicit transaction, so the lock is held until the ticket is committed.
                cur = psycopg.AsyncClientCursor(conn)
                await cur.execute(turn_queue.TAKE_TICKET, params)
                cur.nextset()
                cur.nextset()
                rows = list(await cur.fetchall())
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._error(exc, "turn_lock") from None
        mine, earliest = int(rows[0][0]), rows[0][1]
        # The statement saw the queue as it was before it: a re-owned ticket is among those rows.
        return mine, mine if earliest is None else min(mine, int(earliest))

    async def _head(self, conversation_id: str, lease_us: int) -> int | None:
        """The conversation's lowest ticket, after deleting those that lapsed a lease ago: a
        lapsed ticket is first left for a survivor to take over with its turn or submission
        (keeping its place in line); one nobody took over (a call whose caller died with its
        replica) goes then."""
        stale_us = self._now_us() - lease_us
        rows = await self._read(
            "turn_lock",
            "WITH gone AS (DELETE FROM turn_queue WHERE conversation_id = %(c)s AND lease_until < %(stale)s)"
            " SELECT MIN(ticket) FROM turn_queue WHERE conversation_id = %(c)s AND lease_until >= %(stale)s",
            {"c": conversation_id, "stale": stale_us},
        )
        return None if rows[0][0] is None else int(rows[0][0])

    async def _release(self, conversation_id: str, ticket: int) -> None:
        """Give the ticket up and wake the line; returns once that committed. Group-committed
        with the turn ends and checkpoints queued meanwhile: with many turns ending, their
        releases share transactions (and WAL flushes) instead of taking a pooled connection and
        a commit each, ahead of the next turns' admissions."""

        async def body(conn: Conn, _: int) -> None:
            await db.run(conn, turn_queue.RELEASE_TICKET, (ticket, QUEUE_CHANNEL, conversation_id))

        try:
            await self._write_batched("turn_lock release", body, conversation_id=conversation_id)
        except StoreError as error:  # its lease lapses; the others skip it then
            log.error("releasing the turn lock of %s failed: %s", conversation_id, error)

    async def renew_leases(self, owner: str, until: dt.datetime) -> int:
        """Extend the leases of ``owner``'s running turns, queue tickets and pending submissions to
        ``until``: three statements in one transaction, whatever their number."""
        until_us = to_us(until, "until")

        async def body(conn: Any, now_us: int) -> int:
            cur = await conn.execute(
                b"UPDATE turns SET lease_until = %s WHERE owner = %s AND state = 'running'", (until_us, owner)
            )
            await conn.execute(b"UPDATE turn_queue SET lease_until = %s WHERE owner = %s", (until_us, owner))
            await conn.execute(
                b"UPDATE submissions SET lease_until = %s WHERE owner = %s AND state = 'pending'",
                (until_us, owner),
            )
            return int(cur.rowcount)

        return await self._write("renew_leases", body)

    async def claim_interrupted_turns(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[TurnRecord]:
        """Claim up to ``limit`` running turns whose lease lapsed before ``now`` (their replica
        died): ``FOR UPDATE SKIP LOCKED``, so two survivors never claim the same turn."""
        rows = await self._claim(
            "claim_interrupted_turns",
            "UPDATE turns SET owner = %s, lease_until = %s WHERE request_id IN ("
            " SELECT request_id FROM turns WHERE state = 'running'"
            " AND (lease_until IS NULL OR lease_until < %s) AND owner IS DISTINCT FROM %s"
            f" ORDER BY start_time, request_id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {TURN_COLUMNS}",
            owner=owner,
            now=now,
            lease_until=lease_until,
            limit=limit,
        )
        return sorted((turn_from_row(row) for row in rows), key=lambda t: (t.start_time, t.request_id))

    async def claim_pending_submissions(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[SubmissionRecord]:
        """Claim up to ``limit`` pending submissions whose replica stopped renewing them
        (``FOR UPDATE SKIP LOCKED``: each goes to one claimant), in acceptance order."""
        rows = await self._claim(
            "claim_pending_submissions",
            "UPDATE submissions SET owner = %s, lease_until = %s WHERE id IN ("
            " SELECT id FROM submissions WHERE state = 'pending'"
            " AND (lease_until IS NULL OR lease_until < %s) AND owner IS DISTINCT FROM %s"
            f" ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {SUBMISSION_COLUMNS}",
            owner=owner,
            now=now,
            lease_until=lease_until,
            limit=limit,
        )
        return sorted((submission_from_row(row) for row in rows), key=lambda r: r.seq)

    async def _claim(
        self, name: str, claim_sql: str, *, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[Any]:
        """Run one claim statement (``claim_sql``: parameters owner, lease end, now, owner, limit;
        the claimed rows' first column is the queue key) and take over the claimed keys' queue
        tickets in the same transaction; the rows it returned."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        now_us, until_us = to_us(now, "now"), to_us(lease_until, "lease_until")

        async def body(conn: Any, _: int) -> list[Any]:
            cur = await conn.execute(claim_sql.encode(), (owner, until_us, now_us, owner, limit))
            rows = list(await cur.fetchall())
            await turn_queue.take_over_tickets(conn, [row[0] for row in rows], owner, until_us)
            return rows

        rows: list[Any] = await self._write(name, body)
        return rows

    async def request_cancel(self, request_id: str, *, stop: str = "") -> bool:
        """Notify every replica to cancel turn ``request_id`` (``stop``: the engine's reason, sent
        along); True when it runs or waits somewhere."""
        payload = f"{request_id}\n{stop}" if stop else request_id

        async def body(conn: Any, _: int) -> bool:
            found = await db.fetch_one(
                conn,
                "SELECT 1 FROM turns WHERE request_id = %s AND state = 'running'"
                " UNION ALL SELECT 1 FROM turn_queue WHERE request_id = %s LIMIT 1",
                (request_id, request_id),
            )
            await db.run(conn, "SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, payload))
            return found is not None

        return await self._write("request_cancel", body)

    def cancel_requests(self) -> AsyncIterator[tuple[str, str]]:
        """``(request id, stop reason)`` of the cancels any replica asked for (from the ``LISTEN``
        connection)."""
        return self._listener.cancel_requests()

    async def queue_head(self, conversation_id: str) -> str | None:
        """The request (or submission) id of the conversation's head ticket, across replicas; a
        lapsed ticket counts until it is deleted (its work may be taken over). See
        ``Store.queue_head``."""
        rows = await self._read(
            "queue_head",
            "SELECT request_id FROM turn_queue WHERE conversation_id = %s ORDER BY ticket LIMIT 1",
            (conversation_id,),
        )
        return str(rows[0][0]) if rows else None

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
        """The ticket of ``request_id``, taken now (see ``Store.reserve_place``): as
        :meth:`turn_lock` takes it, or, ``only_if_idle``, in one transaction under the
        conversation's queue lock that takes it only when no other live ticket exists (so of two
        replicas admitting at once, whichever commits first is the one the other sees). Raises
        :class:`StoreError` when the database fails."""
        lease_us = int(lease_seconds * 1_000_000)
        async with self._tickets.hold(conversation_id):  # this process's tickets in call order
            if not only_if_idle:
                await self._take_ticket(conversation_id, request_id, owner, lease_us, first)
                return None
            now_us = self._now_us()
            params = {
                "lock": writes.QUEUE_LOCK_CLASS,
                "owner": owner,
                "until": now_us + lease_us,
                "c": conversation_id,
                "r": request_id,
                "stale": now_us - lease_us,
            }
            try:
                async with self._require_pool("reserve_place").connection() as conn:
                    cur = psycopg.AsyncClientCursor(conn)
                    await cur.execute(turn_queue.TAKE_TICKET_IF_IDLE, params)
                    cur.nextset()
                    cur.nextset()
                    rows = list(await cur.fetchall())
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise self._error(exc, "reserve_place") from None
        return None if rows[0][0] is None else str(rows[0][0])

    async def release_place(self, conversation_id: str, request_id: str) -> None:
        """Delete ``request_id``'s ticket if it is still there and wake the line (see
        ``Store.release_place``)."""

        async def body(conn: Conn, _: int) -> None:
            await db.run(
                conn, turn_queue.RELEASE_PLACE, (conversation_id, request_id, QUEUE_CHANNEL, conversation_id)
            )

        await self._write("release_place", body)

    async def roll_back_turn(self, turn: TurnRecord, message_ids: Sequence[str]) -> None:
        """Remove the turn's messages and record its end, one transaction; see
        ``Store.roll_back_turn``. Raises :class:`TurnNotFound`."""
        finish, ids = message_writes.prepare_roll_back(turn, message_ids)
        await self._write(
            f"roll_back_turn({turn.request_id!r})",
            lambda conn, now_us: run_program(
                conn, message_writes.roll_back_turn(finish, ids, DIALECT, now_us)
            ),
            conversation_id=turn.conversation_id,
        )

    async def submission_offers(self) -> AsyncIterator[None]:
        """Once per wake-up after a replica accepted submissions it left for others (several
        notifications may fold into one; also after the listener reconnected). Never ends."""
        offered = self._listener.offered
        while True:
            await offered.wait()
            offered.clear()
            yield None

    async def wait_for_events(self, request_id: str, after: int, timeout_seconds: float) -> bool:
        """Wait (at most ``timeout_seconds``) until turn ``request_id`` stored events past ``after``
        or ended; True (this store follows other replicas)."""
        with self._listener.waiting(EVENTS_CHANNEL, request_id) as stored:
            stream = await self.get_stream(request_id)
            if stream is not None and (stream.end_time is not None or stream.last_sequence_number > after):
                return True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_seconds):
                    await stored.wait()
        return True


_LOAD_COMPACTION: Final = db.native(LOAD_COMPACTION_SQL)
