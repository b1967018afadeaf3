"""What several replicas sharing one PostgreSQL database need of each other (issue 11):
a first-in-first-out turn lock per conversation, cancel requests, and wake-ups for readers
following a turn another replica runs.

**The turn queue.** ``turn_lock`` inserts a ticket (``turn_queue``, a ``BIGSERIAL``: the order
of acceptance across replicas) and holds the lock once its ticket is the lowest *live* one of
the conversation; it deletes the ticket on release and notifies ``turnwire_queue``. The sequence
steps by ``QUEUE_STEP`` (migration 5), so a ticket taken ``first`` (new input that stops the
running turn, docs/semantics.md §5) can take the number right after the head's and the other
``first_in_line`` tickets behind it: the order is always the numbers', which replicas of the
previous schema read too. ``reserve_place`` takes a ticket before the turn's lock does (which
then takes it over); with ``only_if_idle`` (REJECT) only when no other live ticket exists,
decided under the same queue lock every taker holds. Tickets
carry their replica's lease: a replica that dies stops renewing them, and the others skip and
delete its lapsed tickets (a replica only paused or cut off that long finds its waiting call's
ticket gone and takes another). No connection is held while a turn runs or waits: waiting is a
``LISTEN`` on the replica's one listener connection plus a re-check every third of a lease.

**The listener.** One dedicated connection per store ``LISTEN``\\ s on ``turnwire_queue``
(payload: a conversation id), ``turnwire_cancel`` (a request id), ``turnwire_events`` (a
request id, sent with every stored batch of events) and ``turnwire_submissions`` (a submission
was accepted that no replica claimed: its replica had no free slot) and wakes the waiters here. It reconnects
when the connection drops; waiters re-check on their own timeout meanwhile, so a lost
notification only delays them.

**Reachability.** The listener is also the store's probe of the database (issue 34): between
notifications it sends ``SELECT 1`` every ``PROBE_SECONDS`` and waits at most ``PROBE_TIMEOUT_SECONDS``
for the answer, so a restarted server (the connection reset) and a cut route (no answer) are
both noticed within a few seconds without a connection of its own. :attr:`Listener.reachable`
is False from then until a new connection has ``LISTEN``\\ ed again; the store refuses work at
once meanwhile, and the health service reports NOT_SERVING (docs/operate/outages.md). Between
reconnect attempts it backs off (up to 2 s); a call the store refuses meanwhile cuts that wait
short (:meth:`Listener.nudge`, at most one attempt per :data:`NUDGED_SECONDS`), so a replica
with callers serves again as soon as the database answers, not up to a backoff later.

Why not a queue library (procrastinate and the like): a turn is not a job to hand to any
worker, it runs on the replica that received the call (its caller streams from there), so what
is needed is a lock with an order, not a job queue; the two tables and one listener are less
than a library's model to map onto. Submissions are the one kind of work any replica may run:
their ``submissions`` rows are claimed with ``FOR UPDATE SKIP LOCKED`` in acceptance order, and
their queue tickets are taken at acceptance, so whoever runs one keeps its place in line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg

from turnwire_server.event_waits import cancelled

log = logging.getLogger("turnwire_server.store.postgres")

QUEUE_CHANNEL = "turnwire_queue"
CANCEL_CHANNEL = "turnwire_cancel"
EVENTS_CHANNEL = "turnwire_events"
SUBMISSIONS_CHANNEL = "turnwire_submissions"
_CHANNELS = (QUEUE_CHANNEL, CANCEL_CHANNEL, EVENTS_CHANNEL, SUBMISSIONS_CHANNEL)
_RECONNECT_SECONDS = (0.1, 0.5, 1.0, 2.0)
NUDGED_SECONDS = 0.5
"""The shortest wait between two reconnect attempts when refused calls cut the backoff short:
a server refusing connections because it has too many (counted gone) gets at most two attempts
a second from each replica, not one per refused call."""
PROBE_SECONDS = 1.0
"""Seconds between the listener's round trips when no notification comes."""
PROBE_TIMEOUT_SECONDS = 3.0
"""An answer slower than this counts as the database unreachable (a cut route answers never)."""
_CANCEL_BACKLOG = 1024


class Listener:
    """The store's ``LISTEN`` connection: wakes queue waiters by conversation, event followers by
    request id, and hands cancel requests to :meth:`cancel_requests`.

    ``connect`` opens a new autocommit connection (its errors are retried with backoff);
    ``on_back`` runs when the database answers again after it was unreachable, before
    :attr:`reachable` turns True (the store checks its pooled connections there).
    """

    def __init__(
        self, connect: Callable[[], Any], on_back: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._connect = connect
        self._on_back = on_back
        self._task: asyncio.Task[None] | None = None
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = defaultdict(set)
        self._cancels: asyncio.Queue[str] = asyncio.Queue(_CANCEL_BACKLOG)
        self.offered = asyncio.Event()  # set by a submission offered to any replica
        self._stopping = False
        self.connected = asyncio.Event()
        self._nudged = asyncio.Event()
        self.reachable = True
        """False while the database is known gone: from a failed round trip (here, or a pooled
        connection's, :meth:`suspect`) until the listener has connected and ``LISTEN``\\ ed again."""
        self._answered = False  # the listener has connected once

    def suspect(self) -> None:
        """A pooled connection failed as if the database were gone: count it unreachable now; the
        listener's next round trip (within :data:`PROBE_SECONDS`) sets :attr:`reachable` back
        when the database still answers. Logged only when the database had answered: a store
        that never reached it (a start, ``turnwire migrate``) has its caller say so."""
        if self.reachable and self._answered:
            log.warning(
                "postgres store: the database stopped answering; refusing work until it answers again"
            )
        self.reachable = False

    def nudge(self) -> None:
        """Work was refused because the database was gone: try reconnecting now rather than
        after the rest of the backoff (the attempt still waits :data:`NUDGED_SECONDS` after the
        last one, so a flood of refused calls makes no flood of connection attempts)."""
        self._nudged.set()

    def start(self) -> None:
        """Start listening (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="postgres listener")

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            await cancelled(task)

    @contextlib.contextmanager
    def waiting(self, channel: str, key: str) -> Any:
        """An event set when ``channel`` is notified with payload ``key`` while the block runs."""
        event = asyncio.Event()
        self._waiters[(channel, key)].add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get((channel, key))
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[(channel, key)]

    async def cancel_requests(self) -> AsyncIterator[tuple[str, str]]:
        """``(request id, stop reason)`` of the cancels other replicas asked for, as they come
        (never ends); the payload is the request id, then a newline and the reason when given."""
        while True:
            request_id, _, reason = (await self._cancels.get()).partition("\n")
            yield request_id, reason

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == SUBMISSIONS_CHANNEL:
            self.offered.set()
            return
        if channel == CANCEL_CHANNEL:
            with contextlib.suppress(asyncio.QueueFull):  # a flood of cancels: drop the overflow
                self._cancels.put_nowait(payload)
            return
        for event in self._waiters.get((channel, payload), ()):
            event.set()

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                conn: psycopg.AsyncConnection[Any] = await self._connect()
            except psycopg.Error as error:
                delay = _RECONNECT_SECONDS[min(failures, len(_RECONNECT_SECONDS) - 1)]
                failures += 1
                log.warning("postgres listener: cannot connect (%s); retrying in %.1f s", error, delay)
                await self._back_off(delay)
                continue
            try:
                for channel in _CHANNELS:
                    await conn.execute(f"LISTEN {channel}")
                failures = 0
                await self._back()
                self._answered = True
                self.connected.set()
                # Whatever was notified while not listening is missed: wake every waiter to re-check.
                self.offered.set()
                for waiters in self._waiters.values():
                    for event in waiters:
                        event.set()
                await self._listen(conn)
            except (psycopg.Error, TimeoutError) as error:
                if self._stopping:  # cancelling a wait for notifications can surface as this
                    return
                self.reachable = False
                log.warning("postgres listener: connection lost (%s); reconnecting", error or "no answer")
            finally:
                self.connected.clear()
                with contextlib.suppress(psycopg.Error):
                    await conn.close()

    async def _back_off(self, delay: float) -> None:
        """Wait ``delay`` seconds before the next connection attempt, or less once
        :meth:`nudge`\\ d (but at least :data:`NUDGED_SECONDS`)."""
        floor = min(delay, NUDGED_SECONDS)
        self._nudged.clear()
        await asyncio.sleep(floor)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay - floor):
                await self._nudged.wait()

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Dispatch notifications; every :data:`PROBE_SECONDS` one round trip proves the database
        still answers (and brings :attr:`reachable` back after :meth:`suspect`). Returns never;
        raises ``psycopg.Error`` or ``TimeoutError`` when the connection is lost."""
        while True:
            async for notify in conn.notifies(timeout=PROBE_SECONDS):
                self._dispatch(notify.channel, notify.payload)
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                await conn.execute("SELECT 1")
            await self._back()

    async def _back(self) -> None:
        if self.reachable:
            return
        if self._on_back is not None:
            await self._on_back()
        log.warning("postgres store: the database answers again")
        self.reachable = True
