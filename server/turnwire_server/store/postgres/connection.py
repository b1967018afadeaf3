"""The PostgreSQL store's connections: the URL, the bounded pool, migrations at open, the
``LISTEN`` listener, and transactions (retried when the database aborts one to resolve a race,
applied in call order per conversation, or group-committed by :mod:`.batching`).

:class:`PostgresConnection` is the base of :class:`~turnwire_server.store.postgres.PostgresStore`
and of the mixins that make it up (:mod:`.admission`, :mod:`.notifications`); the reads and the
writes are the shared core's (:class:`CoreReads` on :meth:`~PostgresConnection._read`,
:class:`CoreWrites` on :meth:`~PostgresConnection._commit`).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import psycopg
import psycopg_pool

from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.message_cache import DecodedMessages
from turnwire_server.store.core.reads import CoreReads
from turnwire_server.store.core.schedule_writes import CoreSchedules
from turnwire_server.store.core.sql import Program
from turnwire_server.store.core.webhook_store import CoreWebhooks
from turnwire_server.store.core.writes import ALONE, Commit, CoreWrites
from turnwire_server.store.errors import StoreError, StoreUnreachable, StoreValueRefused
from turnwire_server.store.metrics import COMMIT_DURATION
from turnwire_server.store.postgres import db
from turnwire_server.store.postgres.batching import GroupCommit
from turnwire_server.store.postgres.budget_flight import SpentBudgets
from turnwire_server.store.postgres.db import DIALECT, RACE_ERRORS, RETRIES, Conn, run_program
from turnwire_server.store.postgres.migrations import apply_migrations, load_migrations
from turnwire_server.store.postgres.replicas import Listener
from turnwire_server.store.postgres.stuck_sessions import session_name
from turnwire_server.store.postgres_url import PostgresTarget, parse_postgres_url

__all__ = ["DEFAULT_POOL_SIZE", "SINGLE_COMMITS", "PostgresConnection"]

DEFAULT_POOL_SIZE: Final = 10
"""Connections the pool holds at most unless configured (``store.pool_size``)."""

_CONNECT_TIMEOUT_S: Final = 10.0
_IDLE_IN_TRANSACTION: Final = "SET idle_in_transaction_session_timeout = '5s'"
"""How long PostgreSQL lets a pooled connection sit idle inside a transaction before it ends the
session: the store's transactions never wait on anything but the database, so only a paused process
(SIGSTOP, a frozen VM) or a partition leaves one open, and its row and advisory locks would
otherwise keep the other replicas from taking its turns over (docs/semantics.md §5, "Fencing")."""
_SERVER_TCP: Final = (
    "SET tcp_keepalives_idle = 5",
    "SET tcp_keepalives_interval = 2",
    "SET tcp_keepalives_count = 3",
    "SET tcp_user_timeout = 15000",
)
"""The server's side of a pooled connection's TCP timeouts (session settings; ignored over a Unix
socket): a replica whose route to the database drops while its transaction holds row locks (inside
a pipeline, between a write's read batch and its writes: not idle, so
:data:`_IDLE_IN_TRANSACTION` does not apply) is dropped by the server within about 15 s instead of
the operating system's default of hours, and its locks with it, so another replica can claim its
turns (docs/operate/outages.md). A paused process (its kernel answers keepalives) is ended by the
other replicas' claims instead (:mod:`.stuck_sessions`)."""
SINGLE_COMMITS = COMMIT_DURATION.labels("postgresql", "single")
"""The commit-duration histogram's child for a transaction of its own (not a group commit)."""

_KEEPALIVE: Final = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}
"""TCP keepalives and a send timeout (ms): a connection whose route was cut fails within about
15 s instead of the kernel's many minutes, so a write in flight during a partition ends."""

_GONE_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03"})
"""Admin shutdown, crash shutdown, cannot connect now: the server is going or not yet back."""

_TRANSIENT_REFUSALS: Final = ("starting up", "shutting down", "in recovery", "too many")
"""A server's FATAL answer to a connection attempt (libpq gives it no SQLSTATE) that passes:
starting up or shutting down (57P03), a standby in recovery, out of connection slots (53300).
Any other FATAL answer (no such role or database, a wrong password) is a refusal, never "gone"."""

_CHECK_IDLE_S: Final = 2.0
"""A pooled connection idle longer than this is checked (one round trip) before it is handed
out; one back from use more recently is not, so the hot path pays no check per statement."""

T = TypeVar("T")


class PostgresConnection(CoreWrites, CoreReads, CoreSchedules, CoreWebhooks):
    """The pool, the listener and the transactions of one PostgreSQL store (arguments: see
    :class:`~turnwire_server.store.postgres.PostgresStore`)."""

    _store_name = "postgres"
    _text_holds_nul = False
    _dialect = DIALECT

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        password_env: str | None = None,
        timeout_s: float = 30.0,
        replica_id: str | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self._target: PostgresTarget = parse_postgres_url(url, password_env=password_env)
        # Sessions named for their replica, so a claim can end a paused one's (.stuck_sessions).
        self._session_name = None if replica_id is None else session_name(replica_id)
        self._pool_size = pool_size
        self._timeout_s = timeout_s
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._closed = False
        # Decoded messages reused between a conversation's reads (issue 17).
        self._decoded = DecodedMessages("postgres")
        self._tickets = LocalTurnLocks()  # this process's tickets of a conversation go in call order
        # (conversation, request id) of tickets whose taking lost its answer, their release
        # retried in the background until a later taking that took the ticket removes the pair
        # (TurnQueue._ticket_query); a pair left after its release committed releases nothing.
        self._unreleased: set[tuple[str, str]] = set()
        # Budgets a one-flight admission found spent: their new turns are checked by a read first.
        self._spent_budgets = SpentBudgets()
        self._group_commit = GroupCommit(self._require_pool, self._now_us, self._error)
        self._listener = Listener(self._listen_connection, on_back=self._check_pool)
        # Writes of one conversation are applied in call order (Store: checkpoints are applied in
        # call order): taken before the first await, FIFO, so concurrent calls keep their order.
        self._write_order = LocalTurnLocks()
        self._last_us = 0
        self._returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._releases: set[asyncio.Task[None]] = set()  # turn-lock releases retried after an outage

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
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": int(_CONNECT_TIMEOUT_S),
            **_KEEPALIVE,
        }
        if self._target.password is not None:
            kwargs["password"] = self._target.password
        if self._session_name is not None:
            kwargs["application_name"] = self._session_name
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
                conn, load_migrations(), where="postgres store", now_us=self._now_us()
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
            configure=_configure,
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
        # It just answered: an earlier attempt of this opening (the start waiting out a database
        # restart) may have marked it gone, and the listener is not running yet to say otherwise.
        self._listener.reachable = True
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

    async def _check_pool(self) -> None:
        """The database answers again: replace the pooled connections it dropped meanwhile (a
        restarted server closed them all) before calls are let through."""
        if self._pool is not None:
            await self._pool.check()

    async def _listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own for ``LISTEN`` (not from the pool)."""
        return await psycopg.AsyncConnection.connect(self._target.conninfo, **self._connect_kwargs())

    async def close(self) -> None:
        """Close the pool (waiting for connections in use to come back). Idempotent."""
        self._closed = True
        for task in self._releases:
            task.cancel()
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
        """``exc`` as a :class:`StoreError`: its message names ``what``, the (password-masked) URL
        and the driver's text, for the operator; its ``public`` text, for a client, only ``what``
        and the SQLSTATE (the driver's text may name the user, host, port or database). A data
        exception (a value the database refuses) is a :class:`StoreValueRefused`."""
        if isinstance(exc, StoreError):
            return exc
        sqlstate = getattr(exc, "sqlstate", None)
        if self._is_gone(exc, sqlstate):
            # The database went away (issue 34): the listener confirms, and calls are refused at
            # once (StoreUnreachable, with a retry delay) until it answers again.
            self._listener.suspect()
            text = self._target.redact_text(str(exc).strip() or type(exc).__name__)
            gone = StoreUnreachable(
                f"postgres store: {what} failed: {text}",
                public=f"postgres store: {what} failed: the database cannot be reached; retry shortly",
                in_flight=True,
            )
            gone.__cause__ = None
            return gone
        if isinstance(exc, psycopg_pool.PoolTimeout):
            detail = f"no database connection within {self._timeout_s:g} s (pool of {self._pool_size})"
            public = f"postgres store: {what} failed: {detail}"
        else:
            text = str(exc).strip() or type(exc).__name__
            detail = f"{sqlstate}: {text}" if sqlstate else text
            public = f"postgres store: {what} failed" + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
        message = f"postgres store: {what} failed: {self._target.redact_text(detail)}"
        # psycopg refuses a NUL in a text parameter itself (DataError, no SQLSTATE).
        kind = StoreValueRefused if isinstance(exc, psycopg.DataError) else StoreError
        err = kind(message, public=public)
        err.__cause__ = None
        return err

    @staticmethod
    def _is_gone(exc: BaseException, sqlstate: str | None) -> bool:
        """True for a failure that says the database is gone rather than the statement wrong: a
        lost or refused connection (no SQLSTATE, or class 08) or a server shutting down or
        starting up; not a server's refusal of who connects (:data:`_TRANSIENT_REFUSALS`)."""
        if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return False
        if sqlstate is None and "FATAL:" in (text := str(exc)):
            return any(refusal in text for refusal in _TRANSIENT_REFUSALS)
        return sqlstate is None or sqlstate.startswith("08") or sqlstate in _GONE_SQLSTATES

    @property
    def reachable(self) -> bool:
        """False while the database is known gone (docs/operate/outages.md): work is refused
        at once with :class:`StoreUnreachable` until the listener's round trip answers again."""
        return self._listener.reachable

    def _require_pool(self, what: str) -> psycopg_pool.AsyncConnectionPool[Any]:
        pool = self._pool
        if pool is None:
            raise StoreError(f"postgres store: {what}: store is not open")
        if not self._listener.reachable:
            self._listener.nudge()  # a caller is waiting: the listener's next attempt is now
            raise StoreUnreachable(
                f"postgres store: {what}: the database is unreachable",
                public=f"postgres store: {what}: the database cannot be reached; retry shortly",
            )
        return pool

    async def _read(self, what: str, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        pool = self._require_pool(what)
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(db.native(sql), params)
                return list(await cur.fetchall())
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._error(exc, what) from None

    async def _read_together(
        self, what: str, statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[Any]]:
        """Each statement's rows, read on one snapshot: a ``REPEATABLE READ, READ ONLY``
        transaction in pipeline mode (``BEGIN``, the statements and ``COMMIT`` in one round
        trip; a ``READ COMMITTED`` statement would see each its own snapshot)."""
        pool = self._require_pool(what)
        try:
            async with pool.connection() as conn:
                try:
                    async with conn.pipeline():
                        await conn.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                        cursors = [await conn.execute(db.native(sql), params) for sql, params in statements]
                        await conn.execute(b"COMMIT")
                    return [list(await cursor.fetchall()) for cursor in cursors]
                except psycopg.Error:
                    await db.discard(conn)  # a failed pipeline leaves it unusable (db.discard)
                    raise
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
        for attempt in range(RETRIES):
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
                    SINGLE_COMMITS.observe(time.perf_counter() - started)
                    # Committed, still on its connection: ``then`` reads what the last flight
                    # brought back (a pipelined read sent with the COMMIT costs no round trip).
                    return result if then is None else await then(result)
            except RACE_ERRORS as exc:
                if attempt + 1 == RETRIES:
                    raise self._error(exc, what) from None
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise self._error(exc, what) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _commit(self, what: str, program: Callable[[int], Program[T]], how: Commit = ALONE) -> T:
        """A transaction of its own (:meth:`_write`; in pipeline mode when ``how.pipelined``), or,
        ``how.grouped`` (with a conversation), the next group commit (:meth:`_write_batched`);
        ``how.urgent`` does not apply: nothing here holds a transaction open for more writes."""
        if not how.grouped or how.conversation_id is None:
            return await self._write(
                what,
                lambda conn, now_us: run_program(conn, program(now_us)),
                conversation_id=how.conversation_id,
                pipeline=how.pipelined,
            )
        # The group commit may apply a write again (after another write of its batch failed, or
        # a race): the result is the last application's.
        outcome: list[T] = []

        async def body(conn: Conn, now_us: int) -> None:
            outcome.append(await run_program(conn, program(now_us)))

        await self._write_batched(what, body, conversation_id=how.conversation_id)
        return outcome[-1]

    async def _write_batched(
        self, what: str, body: Callable[[Conn, int], Awaitable[None]], *, conversation_id: str
    ) -> None:
        """Run ``body(conn, now_us)`` in the next group commit (:class:`GroupCommit`): for the hot,
        non-urgent writes; returns once that transaction committed."""
        await self._group_commit.write(what, body, conversation_id=conversation_id)


async def _configure(conn: Any) -> None:
    """A new pooled connection's session settings (:data:`_IDLE_IN_TRANSACTION`,
    :data:`_SERVER_TCP`)."""
    await conn.execute("; ".join((_IDLE_IN_TRANSACTION, *_SERVER_TCP)))  # one round trip
