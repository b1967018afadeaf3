"""A turn's one-flight admission on PostgreSQL, for an idle conversation (docs/semantics.md §5,
"Admission on PostgreSQL"): ``BEGIN``, the conversation's write lock, the queue lock, a ticket
at the head of the queue, the input's writes, the history and compaction reads and the
``COMMIT`` sent together, the server waited for once; and, when the connection is lost with the
``COMMIT``'s answer, the look that tells whether it committed. The waiting path (a busy
conversation, the uncommon cases the flight leaves to it) is :mod:`.admission`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import psycopg
import psycopg_pool

from turnwire_server.store.core import budget_writes, turn_writes
from turnwire_server.store.core.fork_rules import claim_reads
from turnwire_server.store.core.reads import LOAD_COMPACTION_SQL
from turnwire_server.store.core.rows import compaction_from_row, to_us
from turnwire_server.store.core.sql import just
from turnwire_server.store.core.turn_writes import StartTurn, StartTurnPlan
from turnwire_server.store.errors import StoreError
from turnwire_server.store.postgres import budget_flight, db, turn_queue
from turnwire_server.store.postgres.connection import SINGLE_COMMITS, PostgresConnection
from turnwire_server.store.postgres.db import DIALECT, Conn, run_program
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetLimits,
    TurnAdmission,
    TurnRecord,
)

__all__ = ["OneFlight"]

log = logging.getLogger("turnwire_server.store.postgres")

_LOAD_COMPACTION: Final = db.native(LOAD_COMPACTION_SQL)
_OWN_TICKET: Final = (
    # The ticket of a running turn started by one attempt: its request id, owner and start time.
    b"SELECT q.ticket FROM turns AS t JOIN turn_queue AS q"
    b" ON q.conversation_id = t.conversation_id AND q.request_id = t.request_id"
    b" WHERE t.request_id = %s AND t.owner IS NOT DISTINCT FROM %s AND t.start_time = %s"
    b" AND t.state = 'running'"
)
_END_FLIGHT_SESSION: Final = (
    # The session of a flight whose connection was cut, if it still runs (one row), ended; not a
    # session that took its pid over (started after the flight began).
    b"SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity"
    b" WHERE pid = %s AND datname = current_database() AND pid <> pg_backend_pid()"
    b" AND backend_start < now() - make_interval(secs => %s)"
)
_END_SESSION_SECONDS: Final = 5.0
"""How long :meth:`OneFlight._end_session` waits for a cut-off flight's session to end."""
_SUBMISSION_NOT_PENDING: Final = (
    # Fails the transaction (a cast no text passes) when the turn is a submission that is no
    # longer pending: nothing is written and the caller starts the turn the checking way.
    "SELECT ('turnwire: submission ' || id || ' is ' || state)::int FROM submissions"
    " WHERE id = %s AND state NOT IN ('pending', 'running')"
)


class OneFlight(PostgresConnection):
    """The one-flight admission (:meth:`_admit_flight`) and the look after a lost answer
    (:meth:`_own_start`), for :class:`~.admission.TurnQueue`, which tries it first."""

    async def _admit_flight(
        self,
        turn: TurnRecord,
        start: StartTurn,
        ticket_params: Mapping[str, Any],
        read_compaction: bool,
        *,
        budget: BudgetCharge | None,
        refuse: Sequence[BudgetLimits],
    ) -> tuple[int, TurnAdmission] | None:
        """The one-flight admission: ``BEGIN``, the conversation's write lock, the queue lock, the
        ticket (failing the transaction unless it heads the queue), the input's writes
        (:func:`_start_new_turn`, failing it in the uncommon cases), the history and compaction
        reads, ``COMMIT``, sent together; the server is waited for once. ``budget`` (the first
        reservation) and the ``refuse`` check go out with them, decided by the database
        (:mod:`.budget_flight`). Returns the ticket and what was read; None when the transaction
        failed (nothing stored, no ticket taken: the caller takes the waiting path, which also
        reports a database that is down). Raises :class:`BudgetSpent` (nothing stored) when a
        budget of ``refuse`` is spent or has no room for the first step: the flight failed on
        it, or, for a budget that failed a flight lately (:class:`~.budget_flight.SpentBudgets`),
        a read before any flight says so (:meth:`_refuse_spent`). A connection lost on the way
        leaves the ``COMMIT``'s outcome unknown: :meth:`_own_start` tells it."""
        conversation_id = turn.conversation_id
        ask = budget.ask if budget is not None else None
        if refuse and self._spent_budgets.spent(refuse):
            await self._refuse_spent(refuse, ask)
        pool = self._require_pool("admit_turn")
        try:
            async with pool.connection() as conn:
                started = time.perf_counter()
                backend = conn.info.backend_pid  # the session that may still commit, once cut off
                try:
                    # The write lock first, then the queue lock: taking a ticket never waits for
                    # a write (QUEUE_LOCK_CLASS), so no transaction holds them the other way round.
                    async with db.flight(conn), db.conversations_locked(conn, (conversation_id,)):
                        await conn.execute(
                            b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                            (turn_queue.QUEUE_LOCK_CLASS, conversation_id),
                        )
                        ticket = await conn.execute(turn_queue.TAKE_TICKET_AT_HEAD, ticket_params)
                        await _start_new_turn(conn, start, self._now_us())
                        read = self._decoded.read(conversation_id)
                        history = await conn.execute(read.sql.encode(), read.params)
                        compaction = None
                        if read_compaction:
                            compaction = await conn.execute(_LOAD_COMPACTION, (conversation_id,))
                        grant = None
                        if budget is not None or refuse:  # the turn's row is the flight's, and new
                            grant = await budget_flight.send_admission_budget(conn, budget, refuse)
                except psycopg.Error as error:
                    await db.discard(conn)
                    if budget_flight.refused_by_budget(error):
                        self._spent_budgets.note(refuse)
                        await self._refuse_spent(refuse, ask)
                        return None  # settled since: the waiting path checks again
                    if not self._is_gone(error, error.sqlstate):
                        return None  # refused by the server: rolled back
                    ticket = None
                if ticket is not None:
                    SINGLE_COMMITS.observe(time.perf_counter() - started)
                    taken = int((await ticket.fetchall())[0][0])
                    stored = self._decoded.messages(read, await history.fetchall())
                    record = None
                    if compaction is not None and (found := await compaction.fetchall()):
                        record = compaction_from_row(found[0])
                    granted = None if grant is None else await grant()
                    admission = TurnAdmission(stored, record, compaction_read=read_compaction, budget=granted)
                    return taken, admission
        except (psycopg.Error, psycopg_pool.PoolTimeout):
            return None
        sent = (backend, time.perf_counter() - started)
        return await self._own_start(turn, read_compaction, carried=budget is not None, sent=sent)

    async def _refuse_spent(self, refuse: Sequence[BudgetLimits], ask: BudgetAsk | None) -> None:
        """Raise :class:`BudgetSpent` for the first budget of ``refuse`` that is spent, or without
        room for the first step's reservation ``ask`` (None: none carried), read now (the rule of
        ``budget_writes.raise_spent``, which the waiting path's admission applies in its
        transaction); else forget them as spent (a settlement or a new limit made room) and
        return. The refusal a flight failed on is said here, before anything waits in line, as
        when the flight's own check raised it: the call is refused before the engine's ``start``
        returns (docs/cost.md, "When a budget is exhausted")."""
        budget_writes.raise_spent(refuse, await self.budget_spends([limits.key for limits in refuse]), ask)
        self._spent_budgets.forget(refuse)

    async def _own_start(
        self, turn: TurnRecord, read_compaction: bool, *, carried: bool, sent: tuple[int, float]
    ) -> tuple[int, TurnAdmission] | None:
        """The outcome of a start of ``turn`` whose connection was lost before its ``COMMIT``'s
        answer came (docs/semantics.md §5, "A commit's lost answer"): when the stored turn of its
        request id is this attempt's (``turn``'s owner and start time: a replica runs a request id
        once at a time, and each attempt stamps its own start), it committed, and this returns
        its ticket and the conversation read as :meth:`_admit_flight` does (the compaction record
        when ``read_compaction``); None when nothing of it was stored. ``carried``: the flight
        carried a first reservation, whose grant was lost with the answer: the admission's
        ``budget`` is then an empty grant, which covers no step, so the first step charges on its
        own and settles what was reserved at zero (nothing was sent on it), as when a grant does
        not cover it (docs/cost.md, "What it costs per request"). ``sent``: the flight's
        session (its backend's pid) and how many seconds ago the flight began. A cut connection
        does not end that session: the server may still be running the flight (waiting for the
        conversation's lock, say) and commit it after a look, so the session is ended first
        (``pg_terminate_backend``, waiting for it) and only then is the look final. Raises
        :class:`StoreError` (``StoreUnreachable`` while the database is gone) when that cannot be
        told."""
        conversation_id = turn.conversation_id
        mine = (turn.request_id, turn.owner or None, to_us(turn.start_time, "start_time"))
        backend, seconds = sent
        try:
            async with self._require_pool("admit_turn").connection() as conn:
                await self._end_session(conn, backend, seconds)
                found = await (await conn.execute(_OWN_TICKET, mine)).fetchall()
                if not found:
                    return None
                read = self._decoded.read(conversation_id)
                rows = await (await conn.execute(read.sql.encode(), read.params)).fetchall()
                record = None
                if read_compaction:
                    kept = await (await conn.execute(_LOAD_COMPACTION, (conversation_id,))).fetchall()
                    record = compaction_from_row(kept[0]) if kept else None
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._error(exc, "admit_turn") from None
        log.info(
            "start of %s: its connection was lost with the commit's answer; it had committed", turn.request_id
        )
        admission = TurnAdmission(
            self._decoded.messages(read, rows), record, read_compaction, BudgetGrant() if carried else None
        )
        return int(found[0][0]), admission

    async def _end_session(self, conn: Conn, backend: int, seconds: float) -> None:
        """End the session ``backend`` (a pid) of a flight begun ``seconds`` ago, and wait for it
        to be gone: its transaction can then no longer commit. A pid reused since (a session
        started after the flight began) is spared. Raises :class:`StoreError` when it outlives
        :data:`_END_SESSION_SECONDS`; lacking the privilege to end it (another role's session)
        is logged and the look goes on. ``conn`` is in autocommit: each look is a new snapshot."""
        deadline = time.perf_counter() + _END_SESSION_SECONDS
        while True:
            since = seconds + _END_SESSION_SECONDS - (deadline - time.perf_counter())
            try:
                rows = await (await conn.execute(_END_FLIGHT_SESSION, (backend, since))).fetchall()
            except psycopg.errors.InsufficientPrivilege:
                log.warning("the session of a cut-off admission could not be ended (privilege): read as is")
                return
            # No row: gone. False: exiting already (no longer a backend), or not yet: look again.
            if not rows or rows[0][0]:
                return
            if time.perf_counter() > deadline:
                raise StoreError("the session of a cut-off admission did not end: its outcome is unknown")
            await asyncio.sleep(0.05)


async def _start_new_turn(conn: Conn, start: StartTurn, now_us: int) -> None:
    """``Store.start_turn`` for the common case, without a read to wait for: a new request id
    whose messages are all new, so the plan is known before anything is read (the shared
    :func:`~turnwire_server.store.core.turn_writes.start_turn_writes`). Writes only; meant for
    pipeline mode (nothing waits for the server). The uncommon cases make the transaction fail
    instead of deciding: a request id already recorded or a message id already stored (a
    retry, a re-sent message) by their primary keys (``UniqueViolation``), a submission no
    longer pending by :data:`_SUBMISSION_NOT_PENDING` (``InvalidTextRepresentation``); the
    caller then takes the waiting path and :meth:`TurnQueue.start_turn`, which applies the
    shared :func:`~turnwire_server.store.core.turn_writes.decide_start_turn`."""
    await db.send_conversation_lock(conn, start.turn.conversation_id)
    await db.run(conn, _SUBMISSION_NOT_PENDING, (start.turn.request_id,))
    plan = StartTurnPlan(new_rows=start.rows, replace_earlier=False, submission_running=True)
    # A fork's input repeating a message it shares: its own copy first, so the insert fails as
    # for any stored id (docs/forks.md).
    claims = claim_reads(start.turn.conversation_id, [row.id for row in start.rows])
    await run_program(conn, just([*claims, *turn_writes.start_turn_writes(start, plan, DIALECT, now_us)]))
