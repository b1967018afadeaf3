"""What the PostgreSQL driver's modules share: the pool's connections, statement helpers, the
conversation write lock, how it runs the shared core's write programs, and the dialect.

Concurrency: SQLite applies writes one at a time; here several connections write at once, so
every write that reads and then changes a conversation first takes the conversation's lock
(a transaction-level advisory lock on the id, then ``SELECT … FOR UPDATE`` of its row).
Writers of one conversation therefore serialize and each sees what the previous one committed
(READ COMMITTED: every statement reads the latest commits).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TypeAlias, TypeVar

import psycopg
from psycopg import errors as pg_errors

from turnwire_server.store.core.rows import MessageRow
from turnwire_server.store.core.sql import Program, Statement
from turnwire_server.store.postgres import turn_queue
from turnwire_server.store.postgres.replicas import EVENTS_CHANNEL
from turnwire_server.store.records import SubmissionRecord

__all__ = [
    "CONVERSATION_LOCK_CLASS",
    "DIALECT",
    "RACE_ERRORS",
    "RETRIES",
    "SUBMISSIONS_LOCK_KEY",
    "Conn",
    "all_rows",
    "conversations_locked",
    "discard",
    "fetch_one",
    "flight",
    "lock_conversation",
    "native",
    "run",
    "run_many",
    "run_program",
    "send_conversation_lock",
    "transaction",
]

T = TypeVar("T")

Conn: TypeAlias = "psycopg.AsyncConnection[Any]"
"""A connection of the store's pool (autocommit; writes open their own transaction)."""

CONVERSATION_LOCK_CLASS: Final = 0x7477  # "tw"
"""First key of a conversation's advisory lock; the second is ``hashtext(conversation_id)``."""

SUBMISSIONS_LOCK_KEY: Final = 0x7475726E_73756273  # "turnsubs"
"""The advisory lock key serializing submission creations (the dialect's ``lock_submissions``):
concurrent duplicates create one, and ``seq`` (acceptance order) is global, as in SQLite."""

RETRIES: Final = 5
"""Attempts of a transaction that lost a race the database resolved by aborting it."""
RACE_ERRORS: Final = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.UniqueViolation)
"""How the database aborts a transaction that lost a race: serialization failure, deadlock, a
concurrent insert of the same key (applied again from the start, up to :data:`RETRIES` times)."""


# --------------------------------------------------------------------------- helpers


def _encoded(sql: str | bytes) -> bytes:
    return sql if isinstance(sql, bytes) else sql.encode()


async def fetch_one(conn: Conn, sql: str | bytes, params: Sequence[Any] = ()) -> Any:
    """The first row of ``sql`` (None when there is none)."""
    cur = await conn.execute(_encoded(sql), params)
    return await cur.fetchone()


async def all_rows(conn: Conn, sql: str | bytes, params: Sequence[Any] = ()) -> list[Any]:
    cur = await conn.execute(_encoded(sql), params)
    return list(await cur.fetchall())


async def run(conn: Conn, sql: str | bytes, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
    """Execute ``sql``; the number of rows it changed."""
    cur = await conn.execute(_encoded(sql), params)
    return cur.rowcount


async def run_many(conn: Conn, sql: str | bytes, params: Iterable[Sequence[Any]]) -> None:
    rows = list(params)
    if rows:
        async with conn.cursor() as cur:
            await cur.executemany(_encoded(sql), rows)


async def lock_conversation(conn: Conn, conversation_id: str) -> bool:
    """Take the conversation's write lock for the rest of the transaction; True when it exists.

    An advisory transaction lock on the id (so writers that create the conversation serialize
    too), then ``SELECT … FOR UPDATE`` of its row.
    """
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (CONVERSATION_LOCK_CLASS, conversation_id)
    )
    return (
        await fetch_one(conn, "SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))
        is not None
    )


_LOCKED: Final[contextvars.ContextVar[frozenset[str]]] = contextvars.ContextVar(
    "turnwire_locked_conversations", default=frozenset()
)
"""Conversations whose locks the running group commit took up front (:func:`conversations_locked`)."""


async def send_conversation_lock(conn: Conn, conversation_id: str) -> None:
    """:func:`lock_conversation` without waiting for it (in pipeline mode its statements go out
    with the write's next ones), and nothing when the group commit holds the lock already."""
    if conversation_id in _LOCKED.get():
        return
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (CONVERSATION_LOCK_CLASS, conversation_id)
    )
    await conn.execute(b"SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))


@contextlib.asynccontextmanager
async def conversations_locked(conn: Conn, conversation_ids: Iterable[str]) -> AsyncIterator[None]:
    """Take the write locks of ``conversation_ids`` for the rest of the transaction, in id order
    and two statements for all of them (a group commit's writes would take them one by one);
    the writes run inside the block do not take them again."""
    ordered = sorted(set(conversation_ids))
    if len(ordered) == 1:
        # One conversation (most commits): the statements whose generic plans are the primary
        # key's lookups. With ``ANY`` PostgreSQL plans the row lock again at every call (a custom
        # plan, ~50 µs of the server's CPU a commit: bench/budget_cost.md, 2026-12-07).
        await send_conversation_lock(conn, ordered[0])
    else:
        await conn.execute(
            b"SELECT pg_advisory_xact_lock(%s, hashtext(c)) FROM unnest(%s::text[]) AS c",
            (CONVERSATION_LOCK_CLASS, ordered),
        )
        await conn.execute(
            b"SELECT 1 FROM conversations WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (ordered,)
        )
    token = _LOCKED.set(frozenset(ordered))
    try:
        yield
    finally:
        _LOCKED.reset(token)


# --------------------------------------------------------------------------- core programs


@functools.lru_cache(maxsize=1024)
def native(sql: str) -> bytes:
    """Shared SQL's ``?`` placeholders as psycopg's ``%s`` (shared SQL holds no other ``?``)."""
    return sql.replace("?", "%s").encode()


async def run_program(conn: Conn, program: Program[T]) -> T:
    """Run a core write ``program`` (:mod:`turnwire_server.store.core.sql`) inside the caller's
    transaction. Each batch is sent whole, then its reads are fetched: in pipeline mode
    (``conn.pipeline()``) a batch's reads cost one round trip and its writes none (the caller's
    commit syncs them)."""
    try:
        batch = next(program)
        while True:
            sent: list[Any] = []
            counts: dict[int, int] = {}
            for statement in batch:
                sql = native(statement.sql)
                if statement.many:
                    # One execute a row, not executemany: in pipeline mode that syncs (a round
                    # trip) where these go out with the batch.
                    for row in statement.params:
                        await conn.execute(sql, row)
                    sent.append(None)
                else:
                    cursor = await conn.execute(sql, statement.params)
                    if statement.count:
                        counts[len(sent)] = cursor.rowcount
                    sent.append(cursor if statement.fetch else None)
            found: list[Any] = [None if cursor is None else list(await cursor.fetchall()) for cursor in sent]
            for index, count in counts.items():
                found[index] = count
            batch = program.send(found)
    except StopIteration as stop:
        result: T = stop.value
        return result


_PARTS_OF_ROWS: Final = (
    # The new messages' parts from arrays, one statement however many (idx from 0 per message).
    "INSERT INTO parts (conversation_id, message_id, idx, kind, data, version)"
    " SELECT %s, p.message_id, p.idx, p.kind, p.data,"
    " (SELECT history_version FROM conversations WHERE id = %s)"
    " FROM unnest(%s::text[], %s::int[], %s::text[], %s::bytea[]) AS p(message_id, idx, kind, data)"
)


class _PostgresDialect:
    """PostgreSQL's spelling (:class:`~turnwire_server.store.core.sql.Dialect`): rows a write changes
    are locked as read, the conversation's lock is taken first (unless the group commit holds
    it), a batch of parts is one statement over arrays; the cross-replica turn queue's tickets
    (:mod:`.turn_queue`) and notifications go in the transactions of the writes that move them."""

    name = "postgres"
    lock_rows = " FOR UPDATE"
    writes_with = True
    claim_rows = " FOR UPDATE SKIP LOCKED"
    conversation_tables: tuple[str, ...] = (
        # Tickets of its pending submissions no replica claimed (the others go with their turns).
        "DELETE FROM turn_queue WHERE conversation_id = ? AND owner = ''",
    )
    lease_renewals: tuple[str, ...] = ("UPDATE turn_queue SET lease_until = ? WHERE owner = ?",)

    def contains_bytes(self, column: str, needle: bytes) -> str:
        return f"position('\\x{needle.hex()}'::bytea IN {column}) > 0"

    def lock_submissions(self) -> Sequence[Statement]:
        return (Statement("SELECT pg_advisory_xact_lock(%s)", (SUBMISSIONS_LOCK_KEY,)),)

    def submission_queued(self, submission: SubmissionRecord) -> Sequence[Statement]:
        return turn_queue.queue_submission(submission)

    def submissions_ended(self, submission_ids: Sequence[str]) -> Sequence[Statement]:
        return turn_queue.free_unowned_tickets(submission_ids)

    def work_claimed(self, request_ids: Sequence[str], owner: str, until_us: int) -> Sequence[Statement]:
        return turn_queue.take_over_tickets(request_ids, owner, until_us)

    def events_stored(self, request_id: str) -> Sequence[Statement]:
        return (Statement("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, request_id)),)

    def lock_conversation(self, conversation_id: str) -> Sequence[Statement]:
        if conversation_id in _LOCKED.get():
            return ()
        return (
            Statement(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (CONVERSATION_LOCK_CLASS, conversation_id)
            ),
            Statement("SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,)),
        )

    def insert_parts(self, conversation_id: str, rows: Sequence[MessageRow]) -> Sequence[Statement]:
        parts = [(row.id, idx, kind, data) for row in rows for idx, (kind, data) in enumerate(row.parts)]
        if not parts:
            return ()
        message_ids, indexes, kinds, datas = (list(column) for column in zip(*parts, strict=True))
        return (
            Statement(_PARTS_OF_ROWS, (conversation_id, conversation_id, message_ids, indexes, kinds, datas)),
        )

    def replace_parts(self, conversation_id: str, row: MessageRow) -> Sequence[Statement]:
        return (
            Statement(
                "WITH gone AS (DELETE FROM parts"
                " WHERE conversation_id = %(c)s AND message_id = %(m)s AND idx >= %(n)s)"
                " INSERT INTO parts (conversation_id, message_id, idx, kind, data, version)"
                " SELECT %(c)s, %(m)s, p.idx - 1, p.kind, p.data,"
                " (SELECT history_version FROM conversations WHERE id = %(c)s)"
                " FROM unnest(%(kinds)s::text[], %(datas)s::bytea[]) WITH ORDINALITY AS p(kind, data, idx)"
                " ON CONFLICT (conversation_id, message_id, idx) DO UPDATE"
                " SET kind = excluded.kind, data = excluded.data, version = excluded.version"
                " WHERE parts.data IS DISTINCT FROM excluded.data",
                {
                    "c": conversation_id,
                    "m": row.id,
                    "n": len(row.parts),
                    "kinds": [kind for kind, _ in row.parts],
                    "datas": [data for _, data in row.parts],
                },
            ),
        )


DIALECT: Final = _PostgresDialect()
"""The PostgreSQL driver's :class:`~turnwire_server.store.core.sql.Dialect`."""


# --------------------------------------------------------------------------- transactions


async def discard(conn: Conn) -> None:
    """Close ``conn`` (the pool opens another in its place) after a pipelined transaction on it
    failed: psycopg 3.3 counts the statements it prepared in the part of the pipeline the server
    skipped after the error as prepared, though the server never parsed them, so reusing the
    connection fails later with "prepared statement … does not exist"."""
    await conn.close()


def transaction(conn: Conn, pipeline: bool) -> AbstractAsyncContextManager[Any]:
    """A transaction on ``conn``: :func:`flight` when ``pipeline``, else ``conn.transaction()``."""
    return flight(conn) if pipeline else conn.transaction()


@contextlib.asynccontextmanager
async def flight(conn: Conn) -> AsyncIterator[None]:
    """A transaction in pipeline mode that waits for the server only where the block reads and
    once at the end: ``BEGIN`` goes out with the first statements and ``COMMIT`` with the last
    (psycopg's ``conn.transaction()`` would sync at its start and its end, one round trip each).
    An exception in the block rolls back and propagates."""
    async with conn.pipeline() as pipeline:
        await conn.execute(b"BEGIN")
        try:
            yield
        except BaseException:
            # After a failed statement the server skips everything up to the next sync.
            with contextlib.suppress(psycopg.Error):
                await pipeline.sync()
            with contextlib.suppress(psycopg.Error):
                await conn.execute(b"ROLLBACK")
            raise
        await conn.execute(b"COMMIT")
    # Leaving the pipeline synced: the COMMIT's outcome (and any error of the block's statements)
    # is in by now.
