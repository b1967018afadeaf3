"""A turn's admission on PostgreSQL: the cross-replica turn lock (a ticket in ``turn_queue``;
the rules: :mod:`turnwire_server.store.postgres.replicas`), places reserved ahead of it, and the
turn's start, in one flight with its ticket when the conversation is idle (:mod:`.one_flight`)
(``TurnStore.admit_turn``, ``ReplicaStore.reserve_place``; docs/semantics.md §5).

No connection is held while a turn waits or runs: a ticket is taken in one round trip, waiting
is a ``LISTEN`` on the store's listener plus a re-check every third of a lease, and the release
joins the group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

import psycopg
import psycopg_pool

from turnwire_client.v1 import message_pb2
from turnwire_server.event_waits import set_within
from turnwire_server.store.core import turn_writes
from turnwire_server.store.core.turn_writes import StartTurn, prepare_start_turn
from turnwire_server.store.errors import StoreError, StoreUnreachable
from turnwire_server.store.postgres import db, turn_queue
from turnwire_server.store.postgres.db import DIALECT, Conn, run_program
from turnwire_server.store.postgres.one_flight import OneFlight
from turnwire_server.store.postgres.replicas import QUEUE_CHANNEL
from turnwire_server.store.records import (
    BudgetCharge,
    BudgetLimits,
    TurnAdmission,
    TurnRecord,
    renewed_lease,
)

__all__ = ["TurnQueue"]

log = logging.getLogger("turnwire_server.store.postgres")

_RELEASE_RETRY_SECONDS: Final = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Waits before the retries of a failed turn-lock release (the last repeats)."""


class TurnQueue(OneFlight):
    """The turn lock, reserved places and a turn's start (the contracts:
    :mod:`turnwire_server.store.turns`, :mod:`turnwire_server.store.replicas`)."""

    async def start_turn(
        self, turn: TurnRecord, messages: Sequence[message_pb2.Message]
    ) -> Sequence[message_pb2.Message]:
        """Returns the conversation's messages as the transaction left them, read in the same
        flight as its commit."""
        history = (await self._start_turn(turn, messages, None, ())).history
        assert history is not None  # always read
        return history

    async def _start_turn(
        self,
        turn: TurnRecord,
        messages: Sequence[message_pb2.Message],
        budget: BudgetCharge | None,
        refuse: Sequence[BudgetLimits],
    ) -> TurnAdmission:
        """:meth:`start_turn`, ``budget`` and the ``refuse`` check riding its transaction: the
        history read and the grant."""
        start = prepare_start_turn(turn, messages)
        conversation_id = turn.conversation_id

        async def body(conn: Conn, now_us: int) -> Any:
            grant = await run_program(conn, turn_writes.start_turn(start, DIALECT, now_us, budget, refuse))
            # Sent with the writes, answered with the COMMIT: the history costs no round trip.
            read = self._decoded.read(conversation_id)
            return grant, read, await conn.execute(read.sql.encode(), read.params)

        async def history(sent: Any) -> Any:
            grant, read, cursor = sent
            return TurnAdmission(history=self._decoded.messages(read, await cursor.fetchall()), budget=grant)

        # On the hot path (a turn waits for this commit before its model call): pipelined, so it
        # costs two round trips, the reads and the commit (with the history).
        result: TurnAdmission = await self._write(
            f"start_turn({turn.request_id!r})",
            body,
            conversation_id=conversation_id,
            pipeline=True,
            then=history,
        )
        return result

    def turn_lock(
        self,
        conversation_id: str,
        *,
        request_id: str = "",
        owner: str = "",
        lease_seconds: float = 30.0,
        first: bool = False,
    ) -> AbstractAsyncContextManager[None]:
        """A ticket in ``turn_queue``, held once it is the conversation's lowest live ticket.
        ``first`` takes the number right behind the head and the tickets taken first before it
        (``turn_queue.TAKE_TICKET``); when the head's block of numbers has no room left (or the
        head is a ticket of schema 4), the ticket queues at the back."""
        return self._queue_lock(conversation_id, request_id, owner, lease_seconds, first)

    @contextlib.asynccontextmanager
    async def _queue_lock(
        self, conversation_id: str, request_id: str, owner: str, lease_seconds: float, first: bool
    ) -> AsyncIterator[None]:
        lease_us = int(lease_seconds * 1_000_000)
        async with self._tickets.hold(conversation_id):  # this process's tickets in call order
            ticket, head = await self._enqueue(conversation_id, request_id, owner, lease_us, first)
        async with self._held(
            conversation_id, ticket, owner, head, lease_seconds, request_id=request_id, first=first
        ):
            yield

    async def _retake(
        self, conversation_id: str, request_id: str, owner: str, lease_us: int, first: bool
    ) -> tuple[int, int]:
        """A new ticket for a waiter whose ticket is gone (:meth:`_held`), as :meth:`_enqueue`."""
        async with self._tickets.hold(conversation_id):
            return await self._enqueue(conversation_id, request_id, owner, lease_us, first)

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
                await asyncio.shield(self._release(conversation_id, taken, owner))
            raise

    @contextlib.asynccontextmanager
    async def _held(
        self,
        conversation_id: str,
        ticket: int,
        owner: str,
        head: int | None,
        lease_seconds: float,
        *,
        request_id: str,
        first: bool,
    ) -> AsyncIterator[None]:
        """Wait until ``ticket`` heads the conversation's queue (``head`` as last seen), hold it,
        release it on exit (also when cancelled while waiting). A ticket that is gone while it
        waits (no live ticket at or below its number: this replica was paused or cut off for
        longer than a lease past its lease, and a claim or a waiter's look deleted it as lapsed)
        is taken again for ``request_id`` (at the back of the line, or right behind the head for a
        ``first`` one, :meth:`_retake`): the call still holds nothing and stored nothing, so it
        waits on instead of waiting for a number that never comes up again (chaos probe: a call
        stalled until its deadline). A ticket taken over meanwhile (a claimed submission's, which
        keeps its number under the claimant) is compared by number, so both hold it; it is
        re-owned only with its own request, and the store's start of that request's turn lets one
        of them run it (``tests/test_store_postgres_replicas.py``)."""
        lease_us = int(lease_seconds * 1_000_000)
        try:
            while head != ticket:
                with self._listener.waiting(QUEUE_CHANNEL, conversation_id) as moved:
                    head = await self._head(conversation_id, lease_us)
                    if head == ticket:
                        break
                    if head is None or head > ticket:  # the lowest live ticket: ours is gone
                        log.warning(
                            "turn_lock of %s: ticket %d lapsed while this replica did not renew it "
                            "(paused or cut off); queued again",
                            conversation_id,
                            ticket,
                        )
                        ticket, head = await self._retake(conversation_id, request_id, owner, lease_us, first)
                        continue
                    await set_within(moved, max(lease_seconds / 3, 0.05))
            yield
        finally:
            # Shielded: a cancelled turn must still give the lock up.
            await asyncio.shield(self._release(conversation_id, ticket, owner))

    def admit_turn(
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
    ) -> AbstractAsyncContextManager[TurnAdmission]:
        """The ticket, the check that it heads the queue, the input's writes, the history (and
        compaction) reads and the ``COMMIT`` in one transaction sent in one flight; else (turns
        ahead, or the input needs :meth:`start_turn`'s checks: a retried request id, a re-sent
        message, a submission no longer pending) wait in line, then :meth:`start_turn`. Raises
        :class:`ValueError` for an invalid turn or message before anything is sent. ``budget``
        rides the admitting transaction either way (``TurnAdmission.budget``, its grant): on the
        waiting path :meth:`start_turn`'s; on the idle path the flight's, decided by the database
        (:mod:`.budget_flight`: the flight still waits once). ``refuse`` is checked on the
        charge's rows (no statement of its own then), or on a read of its own; a spent budget
        fails the flight, and a read of the budgets then raises
        :class:`~turnwire_server.store.errors.BudgetSpent` (nothing stored; ``OneFlight``)."""
        start = prepare_start_turn(turn, messages)
        return self._admit(
            turn,
            messages,
            start,
            lease_seconds,
            read_compaction=read_compaction,
            queued=queued,
            first=first,
            budget=budget,
            refuse=refuse,
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
        budget: BudgetCharge | None,
        refuse: Sequence[BudgetLimits],
    ) -> AsyncIterator[TurnAdmission]:
        conversation_id, request_id, owner = turn.conversation_id, turn.request_id, turn.owner
        lease_us = int(lease_seconds * 1_000_000)
        async with self._tickets.hold(conversation_id):  # this process's tickets in call order
            flight = asyncio.ensure_future(
                self._admit_flight(
                    turn,
                    start,
                    self._ticket_params(conversation_id, request_id, owner, lease_us),
                    read_compaction,
                    budget=budget,
                    refuse=refuse,
                )
            )
            try:
                admitted = await asyncio.shield(flight)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    if (done := await flight) is not None:
                        await asyncio.shield(self._release(conversation_id, done[0], owner))
                raise
            if admitted is not None:
                self._unreleased.discard((conversation_id, request_id))  # its ticket is this taking's
            else:
                queued(True)
                ticket, head = await self._enqueue(conversation_id, request_id, owner, lease_us, first)
        if admitted is not None:
            ticket, admission = admitted
            try:
                yield admission
            finally:
                await asyncio.shield(self._release(conversation_id, ticket, owner))
            return
        async with self._held(
            conversation_id, ticket, owner, head, lease_seconds, request_id=request_id, first=first
        ):
            queued(False)
            yield await self._start_turn(renewed_lease(turn, lease_seconds), messages, budget, refuse)

    async def _take_ticket(
        self, conversation_id: str, request_id: str, owner: str, lease_us: int, first: bool = False
    ) -> tuple[int, int]:
        """Take (or, for work taken over from a dead replica, re-own) the ticket of
        ``request_id``; returns it and the conversation's head ticket. One round trip, so an idle
        conversation costs one before the turn's input is stored.

        Takers of one conversation serialize on its queue lock: a ticket is numbered and
        committed before the next taker looks, so no two takers both find themselves at the head
        and ticket order is commit order (first in, first out), except that a ``first`` ticket
        takes the free number right behind the head (and the ``first`` tickets before it)."""
        params = self._ticket_params(conversation_id, request_id, owner, lease_us)
        rows = await self._ticket_query(
            "turn_lock", turn_queue.TAKE_TICKET, {**params, "first": first}, lambda _: True
        )
        mine, earliest = int(rows[0][0]), rows[0][1]
        # The statement saw the queue as it was before it: a re-owned ticket is among those rows.
        return mine, mine if earliest is None else min(mine, int(earliest))

    async def _head(self, conversation_id: str, lease_us: int) -> int | None:
        """The conversation's lowest ticket, after deleting those that lapsed a lease ago: a
        lapsed ticket is first left for a survivor to take over with its turn or submission
        (keeping its place in line); one nobody took over (a call whose caller died with its
        replica) goes then."""
        stale_us = self._now_us() - lease_us
        rows = await self._read("turn_lock", turn_queue.HEAD, {"c": conversation_id, "stale": stale_us})
        return None if rows[0][0] is None else int(rows[0][0])

    async def _release(self, conversation_id: str, ticket: int, owner: str) -> None:
        """Give the ticket up and wake the line; returns once that committed. Only while
        ``owner`` holds it: a ticket a survivor took over with its turn (this replica was paused
        or cut off past its lease) stays the survivor's (docs/semantics.md §5, "Fencing"). Group-committed
        with the turn ends and checkpoints queued meanwhile: with many turns ending, their
        releases share transactions (and WAL flushes) instead of taking a pooled connection and
        a commit each, ahead of the next turns' admissions."""

        async def body(conn: Conn, _: int) -> None:
            await db.run(conn, turn_queue.RELEASE_TICKET, (ticket, owner, QUEUE_CHANNEL, conversation_id))

        await self._give_up_place("turn_lock release", conversation_id, body)

    async def _give_up_place(
        self,
        what: str,
        conversation_id: str,
        body: Callable[[Conn, int], Any],
        still: Callable[[], bool] | None = None,
    ) -> bool:
        """Commit ``body`` (a ticket's release; True when it committed now); when the store fails
        it, retry in the background until the database takes it. This replica renews its tickets'
        leases, so a ticket left behind would hold the line forever (issue 34); the store closing
        ends the retries (the ticket then lapses with this replica's leases). ``still``: whether a
        retry is still wanted, asked before each under the conversation's ticket order
        (:attr:`_tickets`), so no taking of this process runs between that answer and the
        release's commit."""
        try:
            await self._write_batched(what, body, conversation_id=conversation_id)
        except StoreError as error:
            log.warning("%s of %s failed (%s); retrying", what, conversation_id, error)
            task = asyncio.create_task(self._release_later(what, conversation_id, body, still), name=what)
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
            return False
        return True

    async def _release_later(
        self,
        what: str,
        conversation_id: str,
        body: Callable[[Conn, int], Any],
        still: Callable[[], bool] | None,
    ) -> None:
        for attempt in itertools.count():
            await asyncio.sleep(_RELEASE_RETRY_SECONDS[min(attempt, len(_RELEASE_RETRY_SECONDS) - 1)])
            if self._closed:
                return
            try:
                if still is None:
                    await self._write_batched(what, body, conversation_id=conversation_id)
                else:
                    async with self._tickets.hold(conversation_id):
                        if not still():
                            return
                        await self._write_batched(what, body, conversation_id=conversation_id)
            except StoreError:
                continue
            log.info("%s of %s committed after %d retries", what, conversation_id, attempt + 1)
            return

    def _ticket_params(
        self, conversation_id: str, request_id: str, owner: str, lease_us: int
    ) -> dict[str, Any]:
        """The parameters of the ticket statements (``turn_queue.TAKE_TICKET*``), lease from now."""
        now_us = self._now_us()
        return {
            "lock": turn_queue.QUEUE_LOCK_CLASS,
            "owner": owner,
            "until": now_us + lease_us,
            "c": conversation_id,
            "r": request_id,
            "stale": now_us - lease_us,
        }

    async def _ticket_query(
        self, what: str, sql: bytes, params: Mapping[str, Any], took: Callable[[list[Any]], bool]
    ) -> list[Any]:
        """:meth:`_simple_query` of a statement taking a ticket (``params``: :meth:`_ticket_params`;
        ``took(rows)``: whether its answer says it took it). When its commit's answer was lost
        (``StoreUnreachable``, in flight) the ticket may have been taken: it is given up (retried
        until the database takes it), or this replica's lease renewals would keep it in line for
        good with no turn behind it (docs/semantics.md §5, "A commit's lost answer"). A release
        retried in the background gives up once a later taking of the same request id's ticket
        by this process took it (the caller's retry): that ticket is the retry's, and deleting it
        would let the next turn run beside it. Callers hold the conversation's :attr:`_tickets`
        order, which the retries take too."""
        conversation_id, request_id, owner = params["c"], params["r"], params["owner"]
        key = (conversation_id, request_id)
        try:
            rows = await self._simple_query(what, sql, params)
            if took(rows):
                self._unreleased.discard(key)
            return rows
        except StoreUnreachable as error:
            if error.in_flight and request_id:
                self._unreleased.add(key)

                async def body(conn: Conn, _: int) -> None:
                    notify = (QUEUE_CHANNEL, conversation_id)
                    await db.run(
                        conn, turn_queue.RELEASE_OWN_PLACE, (conversation_id, request_id, owner, *notify)
                    )

                if await self._give_up_place(
                    f"{what} (answer lost) release", conversation_id, body, lambda: key in self._unreleased
                ):
                    self._unreleased.discard(key)
            raise

    async def _simple_query(self, what: str, sql: bytes, params: Mapping[str, Any]) -> list[Any]:
        """The rows of the last of ``sql``'s statements, sent as one simple query (client-side
        binding): one round trip and one implicit transaction, so the queue lock its statements
        take is held until the ticket they write is committed."""
        try:
            async with self._require_pool(what).connection() as conn:
                cur = psycopg.AsyncClientCursor(conn)
                await cur.execute(sql, params)
                while cur.nextset():
                    pass
                return list(await cur.fetchall())
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._error(exc, what) from None

    # ------------------------------------------------------------------ places reserved ahead

    async def queue_head(self, conversation_id: str) -> str | None:
        """A lapsed ticket counts until it is deleted (its work may be taken over)."""
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
        """The ticket, taken as :meth:`turn_lock` takes it, or, ``only_if_idle``, in one
        transaction under the conversation's queue lock that takes it only when no other live
        ticket exists (so of two replicas admitting at once, whichever commits first is the one
        the other sees)."""
        lease_us = int(lease_seconds * 1_000_000)
        async with self._tickets.hold(conversation_id):  # this process's tickets in call order
            if not only_if_idle:
                await self._take_ticket(conversation_id, request_id, owner, lease_us, first)
                return None
            params = self._ticket_params(conversation_id, request_id, owner, lease_us)
            rows = await self._ticket_query(
                "reserve_place", turn_queue.TAKE_TICKET_IF_IDLE, params, lambda found: found[0][0] is None
            )
        return None if rows[0][0] is None else str(rows[0][0])

    async def release_place(self, conversation_id: str, request_id: str) -> None:
        async def body(conn: Conn, _: int) -> None:
            await db.run(
                conn, turn_queue.RELEASE_PLACE, (conversation_id, request_id, QUEUE_CHANNEL, conversation_id)
            )

        await self._give_up_place("release_place", conversation_id, body)
