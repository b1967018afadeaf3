"""What this process does as one replica among several sharing a store: it renews the leases of
the turns it runs, takes over the turns of replicas that died, and cancels its turns when
another replica is asked to (docs/semantics.md §5, §8).

Every ``lease_seconds / 3`` one store call renews the leases of all of this replica's running
turns (a batch, never a statement per turn), then one claims running turns whose lease lapsed
(their process died: SIGKILL, a lost node) and recovers them here. Claiming is atomic in the
store, so with several survivors each turn is recovered by one of them. With the embedded
SQLite store one process serves the file: the claim at start finds every interrupted turn and
later claims find none, and no cancel request ever comes from elsewhere.

A renewal extends the lease of every turn the store records ``running`` under this replica, and
says which those are. One among them that nothing here runs (its end could not be stored, its
input's commit or its claim was cut off after it landed, its recovery did not start) would keep
its lease for as long as the replica lives, and never be recovered: right after each renewal its
lease is given up (:meth:`TurnEngine.release_orphaned`), so a claim, this replica's own
included, recovers it.

After the store was unreachable (a renewal failed), the first renewal that succeeds is followed
by a lease's time without claims (issue 34, docs/operate/outages.md): the other replicas' leases
may have lapsed during the same outage while they lived, and they renew within a third of a
lease once they reach the store again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time

from turnwire_server.engine.engine import TurnEngine
from turnwire_server.engine.submissions import Submissions
from turnwire_server.event_waits import cancelled

log = logging.getLogger("turnwire.leases")

_CLAIM_BATCH = 100


class Replica:
    """Renews this replica's turn leases, recovers lapsed turns and serves cancel requests from
    other replicas, until :meth:`stop`.

    ``resume`` is ``durability.recover_on_start`` (False: lapsed turns are ended INTERRUPTED);
    ``submissions`` (when given) claims pending submissions no replica runs (left unclaimed by a
    replica without a free slot, or of replicas that died): on each tick, and as offers come.
    """

    def __init__(self, engine: TurnEngine, *, resume: bool, submissions: Submissions | None = None) -> None:
        self._engine = engine
        self._resume = resume
        self._submissions = submissions
        self._tasks: list[asyncio.Task[None]] = []
        self._recoveries: set[asyncio.Task[None]] = set()  # of turns taken over, not awaited by a tick
        self._cut_off = False  # the last renewal failed (the store unreachable)
        self._claims_from = 0.0  # time.monotonic() before which nothing is claimed

    @property
    def interval_seconds(self) -> float:
        """Seconds between renewals: a third of the lease, so two renewals can fail in a row."""
        return self._engine.settings.durability.lease_seconds / 3

    def start(self) -> None:
        """Start the lease loop, the cancel listener and the submission claims (idempotent)."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._run(), name="turn leases"),
                asyncio.create_task(self._engine.serve_cancel_requests(), name="cancel requests"),
            ]
            if self._submissions is not None:
                self._tasks.append(asyncio.create_task(self._submissions.serve(), name="submission claims"))

    async def stop(self) -> None:
        """Stop them, and recoveries still starting; turns still running keep their last lease
        until it lapses."""
        tasks, self._tasks = [*self._tasks, *self._recoveries], []
        for task in tasks:
            task.cancel()
        for task in tasks:
            await cancelled(task)

    async def tick(self) -> int:
        """One renewal, then the claims of lapsed turns and pending submissions; returns how many
        lapsed turns were taken over. Their recoveries start on a task of their own: a recovery's
        first write may wait (for the conversation's lock, a slow store), and the renewals of every
        lease this replica holds, the recovering turns' included, must not wait with it."""
        engine = self._engine
        settings = engine.settings
        lease_seconds = settings.durability.lease_seconds
        now = dt.datetime.now(dt.UTC)
        until = now + dt.timedelta(seconds=lease_seconds)
        try:
            held = await engine.store.renew_leases(settings.replica_id, until)
        except Exception:
            self._cut_off = True
            raise
        if self._cut_off:
            # Back after the store was unreachable: every replica's renewals failed meanwhile, so
            # their leases may have lapsed though they live. Claim nothing for a lease, while they
            # renew theirs (within a third of it), so an outage takes over no live replica's turns.
            self._cut_off = False
            self._claims_from = time.monotonic() + lease_seconds
            log.warning(
                "leases renewed after the store was unreachable; no takeovers for %.0f s", lease_seconds
            )
        # Turns running in the store under this replica that nothing here runs: their leases,
        # renewed above like any other, are given up so that a claim recovers them. Before this
        # tick's claim: a turn it claims runs here (or is given up) by the next renewal.
        await engine.release_orphaned(held)
        if engine.draining or time.monotonic() < self._claims_from:
            return 0  # a stopping replica takes on no new work; one just back waits (above)
        claimed = await engine.store.claim_interrupted_turns(settings.replica_id, now, until, _CLAIM_BATCH)
        if claimed:
            log.warning("took over %d turn(s) whose replica stopped renewing its leases", len(claimed))
            recovering = engine.recover_turns(claimed, resume=self._resume)  # marked at once
            # The coroutine itself on the task: cancelled (by stop) before it ran, it is closed,
            # never left unawaited.
            task = asyncio.create_task(recovering, name="turn recoveries")
            self._recoveries.add(task)
            task.add_done_callback(functools.partial(self._recovered, count=len(claimed)))
        if self._submissions is not None and (started := await self._submissions.claim()):
            log.info("claimed %d pending submission(s) no replica ran", started)
        return len(claimed)

    def _recovered(self, task: asyncio.Task[None], *, count: int) -> None:
        self._recoveries.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            # A store failure: the next renewal gives their leases up.
            log.error("recovering %d turn(s) taken over failed: %s", count, error)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            try:
                await self.tick()
            except Exception as error:  # the next tick retries; a lease lasts three intervals
                log.error("renewing turn leases failed: %s", error)
