"""The PostgreSQL store's group commit (as the SQLite writer does): the hot, non-urgent writes
(checkpoints, event batches, turn ends, queue releases) queued meanwhile share one transaction,
so with a hundred turns streaming one commit (and one WAL flush) serves many of them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import psycopg_pool

from turnwire_server.store.errors import StoreError
from turnwire_server.store.metrics import COMMIT_DURATION
from turnwire_server.store.postgres import db
from turnwire_server.store.postgres.db import RACE_ERRORS, RETRIES, Conn

__all__ = ["GroupCommit"]

_GROUP_COMMITS = COMMIT_DURATION.labels("postgresql", "group")


@dataclasses.dataclass(slots=True)
class _Queued:
    """A write waiting for the next group commit."""

    conversation_id: str
    what: str
    body: Callable[[Any, int], Awaitable[None]]
    future: asyncio.Future[None]


class GroupCommit:
    """Writes queued on the event loop, applied together by one flusher task.

    ``pool(what)`` is the store's open pool (raising :class:`StoreError` when it is not open),
    ``now_us()`` the store's write clock (µs since the epoch, strictly increasing), and
    ``error(exc, what)`` turns a database error into the store's :class:`StoreError`.
    """

    def __init__(
        self,
        pool: Callable[[str], psycopg_pool.AsyncConnectionPool[Any]],
        now_us: Callable[[], int],
        error: Callable[[BaseException, str], StoreError],
    ) -> None:
        self._pool = pool
        self._now_us = now_us
        self._error = error
        self._batch: list[_Queued] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(
        self, what: str, body: Callable[[Conn, int], Awaitable[None]], *, conversation_id: str
    ) -> None:
        """``body(conn, now_us)`` joins the writes queued meanwhile in one transaction, each
        under its own savepoint when one fails (one failing undoes only itself); returns once
        that transaction committed. Raises :class:`StoreError` (the database failed, naming
        ``what``) or what ``body`` raised."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batch.append(_Queued(conversation_id, what, body, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="postgres group commit")
        await future

    async def _flush(self) -> None:
        while self._batch:
            # Stable sort: call order within a conversation, one lock order for every replica's
            # batches (two batches taking conversation locks in other orders could deadlock).
            batch, self._batch = sorted(self._batch, key=lambda q: q.conversation_id), []
            await self._apply_batch(batch)

    async def _apply_batch(self, batch: list[_Queued]) -> None:
        outcomes: list[BaseException | None] = []
        failure: BaseException | None = None
        for _ in range(RETRIES):
            outcomes = []
            try:
                pool = self._pool("group commit")
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
            except RACE_ERRORS as exc:
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
        except RACE_ERRORS:
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
                except RACE_ERRORS:
                    raise
                except (psycopg.Error, StoreError, ValueError) as error:
                    outcomes.append(
                        self._error(error, queued.what) if isinstance(error, psycopg.Error) else error
                    )
        return outcomes
