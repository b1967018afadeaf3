"""Durable submissions: accepted at once, run later through the ordinary turn pipeline.

docs/semantics.md §7. A submission is stored (``pending``) before it is acknowledged, with its
place in the conversation's turn queue; its turn (request id = submission id) holds the turn
lock from that place, so submissions and blocking calls run first in, first out together,
whichever replica runs the submission. The turn's ``start_turn`` marks it ``running`` in the
same transaction that appends its messages; its ``finish_turn`` ends it, never over ``aborted``.

**Whichever replica is free runs it.** A replica runs at most ``max_running`` submission turns
at once (started, queued for their conversation, or running). With a free slot it claims a
submission it accepts; without one it stores it unclaimed, and replicas with free slots claim
unclaimed submissions in acceptance order (``FOR UPDATE SKIP LOCKED`` in the store): when told
one was offered (``Store.submission_offers``), when a slot of theirs frees, and on every lease
tick. A replica that died stops renewing its submissions' leases; the others claim those too.
After a restart the same claim starts pending submissions; a running one is recovered with its
turn (``TurnEngine.recover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping

from turnwire.hooks import ConcurrentInputStrategy
from turnwire_server.engine.engine import TurnEngine
from turnwire_server.engine.errors import (
    AdmissionRefused,
    InputNotStored,
    SubmissionExpired,
    SubmissionNotFound,
)
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.turn_base import ErrorStatus
from turnwire_server.engine.turn_handle import TurnHandle
from turnwire_server.event_waits import cancelled
from turnwire_server.store.records import SubmissionRecord, SubmissionState
from turnwire_server.store.submissions import SubmissionStore

log = logging.getLogger("turnwire.submissions")

_OPEN = ("pending", "running")
_CLAIM_BATCH = 500


@dataclasses.dataclass
class _Watched:
    """The watches waiting for one submission to move (``Submissions.moved_here``)."""

    moved: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    waiters: int = 0


class Submissions:
    """Accepts, starts, cancels and restarts submissions.

    ``turn_request(record)`` builds the turn of a stored submission (the API layer decodes
    its request); ``max_open`` bounds pending and running submissions per conversation;
    ``max_running`` (>= 1) bounds the submission turns this replica runs at once;
    ``error_status`` maps an error to the ``google.rpc.Status`` stored with a submission.
    """

    def __init__(
        self,
        engine: TurnEngine,
        store: SubmissionStore,
        *,
        turn_request: Callable[[SubmissionRecord], TurnRequest],
        max_open: int,
        max_running: int,
        error_status: ErrorStatus,
    ) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self._engine = engine
        self._store = store
        self._turn_request = turn_request
        self._max_open = max_open
        self._max_running = max_running
        self._error_status = error_status
        self._settling: set[asyncio.Task[None]] = set()
        self._slots = 0  # submission turns of this replica: running, queued, or being claimed
        self._claiming = asyncio.Lock()
        # Set when unclaimed submissions may wait (one was offered, or a claim filled every free
        # slot): the next freed slot claims.
        self._missed = False
        self._wake = asyncio.Event()
        # Submissions this replica took to run whose turn is not registered in the engine yet
        # (stored, or claimed, and engine.start not returned): set once it is, or failed.
        self._starting: dict[str, asyncio.Event] = {}
        # Watches of a pending submission on a store one process uses (no other replica can run
        # it): set when this replica takes it to start or ends it (``_moved``).
        self._watched: dict[str, _Watched] = {}

    async def submit(
        self,
        submission: SubmissionRecord,
        *,
        trace_context: Mapping[str, str] | None = None,
        concurrent_input: ConcurrentInputStrategy | None = None,
    ) -> tuple[SubmissionRecord, bool]:
        """Store ``submission`` (or find the one it repeats) and, when new, start its turn.

        ``trace_context`` (the submitting call's W3C trace context) becomes the parent of the
        turn's span when the turn starts here at once; a turn claimed later (another replica, a
        restart) starts a trace of its own. ``concurrent_input`` (``interrupt``, ``rollback``)
        applies likewise only to a turn started here at once (docs/semantics.md §5).

        Returns the stored record and whether this call created it. Raises the store's
        :class:`~turnwire_server.store.errors.SubmissionConflict`,
        :class:`~turnwire_server.store.errors.TooManySubmissions` or
        :class:`~turnwire_server.store.errors.StoreError`.
        """
        settings = self._engine.settings
        # Claimed here only with a free slot (taken before the first await, so concurrent calls
        # cannot overshoot the bound); else stored unclaimed for any replica with one.
        mine = self._slots < self._max_running and not self._engine.draining
        if mine:
            self._slots += 1
            submission = dataclasses.replace(
                submission,
                owner=settings.replica_id,
                lease_until=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=settings.durability.lease_seconds),
            )
        else:
            submission = dataclasses.replace(submission, owner="", lease_until=None)
        starting = self._take(submission.submission_id) if mine else None
        try:
            try:
                record, created = await self._store.create_submission(submission, max_open=self._max_open)
            except BaseException:
                if mine:
                    self._free_slot()
                raise
            if mine and created:
                await self._start(record, trace_context, concurrent_input)
            elif mine:
                self._free_slot()
            elif created:
                self._missed = True  # this replica's next free slot claims it, if nobody did
        finally:
            if starting is not None:
                self._started(submission.submission_id, starting)
        return record, created

    def _take(self, submission_id: str) -> asyncio.Event:
        """Mark ``submission_id`` as being started here (``started_here`` waits on it)."""
        starting = self._starting.setdefault(submission_id, asyncio.Event())
        self._moved(submission_id)
        return starting

    def _moved(self, submission_id: str) -> None:
        """Wake the watches waiting for ``submission_id`` in ``moved_here``."""
        if (watched := self._watched.pop(submission_id, None)) is not None:
            watched.moved.set()

    def _started(self, submission_id: str, starting: asyncio.Event) -> None:
        starting.set()
        if self._starting.get(submission_id) is starting:
            del self._starting[submission_id]

    async def started_here(self, submission_id: str, timeout_seconds: float) -> bool:
        """Wait (at most ``timeout_seconds``) for the turn of ``submission_id`` when this replica
        stored or claimed it and is starting it: the store says ``pending`` or ``running`` before
        the engine knows the turn. True when it was starting here (now it runs, or its start
        failed), False when not (WatchSubmission then follows the store)."""
        starting = self._starting.get(submission_id)
        if starting is None:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_seconds):
                await starting.wait()
        return True

    async def moved_here(self, submission_id: str, timeout_seconds: float) -> None:
        """Wait (at most ``timeout_seconds``) until this replica takes ``submission_id`` to start
        (a claim: a free slot, a schedule's fire) or ends it (cancelled, expired, refused).

        For a watch of a pending submission on a store one process uses: no other replica can
        run it, so its watch waits here, however long it waits for a slot (docs/semantics.md §7).
        """
        if submission_id in self._starting or self._engine.handle(submission_id) is not None:
            return  # taken between the watch's look at the store and now
        watched = self._watched.setdefault(submission_id, _Watched())
        watched.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_seconds):
                    await watched.moved.wait()
        finally:
            watched.waiters -= 1
            if not watched.waiters and self._watched.get(submission_id) is watched:
                del self._watched[submission_id]  # bounded by the watches waiting now

    def _free_slot(self) -> None:
        self._slots -= 1
        if self._missed:
            self._wake.set()

    async def _start(
        self,
        record: SubmissionRecord,
        trace_context: Mapping[str, str] | None = None,
        concurrent_input: ConcurrentInputStrategy | None = None,
    ) -> None:
        """Start the turn of a submission this replica claimed; it holds one slot until it ends."""
        request = self._turn_request(record)
        if trace_context:
            request = dataclasses.replace(request, trace_context=trace_context)
        if concurrent_input is not None:
            request = dataclasses.replace(request, concurrent_input=concurrent_input)
        try:
            handle = await self._engine.start(request, detached=True, queue_limit=False)
        except AdmissionRefused as error:
            # Shutting down: it stays pending and runs after the restart (or on another replica).
            log.warning("submission %s stays pending: %s", record.submission_id, error)
            self._free_slot()
            return
        task = asyncio.create_task(self._settle(record, handle), name=f"submission {record.submission_id}")
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, record: SubmissionRecord, handle: TurnHandle) -> None:
        """Free the turn's slot when it ended; a turn that ended before storing its input never
        moved its submission: end it here."""
        try:
            await asyncio.shield(handle.task)
        finally:
            self._free_slot()
        run = handle.run
        if run.messages_persisted:
            return  # finish_turn ended it (or, at shutdown, left it for the recovery)
        if self._engine.draining:
            return  # stopped by the shutdown before it ran: it stays pending for the next start
        state: SubmissionState = "aborted" if run.outcome == "aborted" else "error"
        error = run.status_error.SerializeToString() if run.status_error is not None else None
        try:
            await self._store.end_submission(record.submission_id, state, error, only_from=("pending",))
        except Exception as failure:
            log.error("submission %s: recording its end failed: %s", record.submission_id, failure)
        self._moved(record.submission_id)

    async def cancel(self, submission_id: str) -> SubmissionRecord:
        """Cancel a pending or running submission (it ends ``aborted``; a late completion never
        overwrites that); a finished one is returned unchanged. Raises
        :class:`SubmissionNotFound`."""
        record = await self._store.get_submission(submission_id)
        if record is None:
            raise SubmissionNotFound(submission_id)
        if record.state not in _OPEN:
            return record
        error = None
        if record.state == "pending":
            why = InputNotStored("its submission was cancelled before it ran")
            error = self._error_status(why, "persist").SerializeToString()
        updated = await self._store.end_submission(submission_id, "aborted", error, only_from=_OPEN)
        self._moved(submission_id)
        await self._engine.cancel_anywhere(submission_id)  # it may run or wait on another replica
        if updated is None:
            raise SubmissionNotFound(submission_id)
        return updated

    async def expire(self, now: dt.datetime, *, expiry_seconds: float, batch: int = 500) -> int:
        """End the submissions pending for more than ``expiry_seconds`` as ``error`` (reason
        ``EXPIRED``) and stop their queued turns; a maintenance sweep (docs/semantics.md §12).
        Returns how many expired."""
        if expiry_seconds <= 0:
            return 0
        error = self._error_status(SubmissionExpired(expiry_seconds), "persist").SerializeToString()
        cutoff = now - dt.timedelta(seconds=expiry_seconds)
        expired = 0
        while ids := await self._store.expire_submissions(cutoff, batch, error):
            for submission_id in ids:
                self._engine.cancel(submission_id)
                self._moved(submission_id)
            expired += len(ids)
            if len(ids) < batch:
                break
        return expired

    async def claim(self) -> int:
        """Claim pending submissions no replica runs (left unclaimed, or their replica died), in
        acceptance order, up to this replica's free slots, and start their turns; called at
        start, on every lease tick (``engine.replica``) and by :meth:`serve`. Returns how many
        started. Raises :class:`~turnwire_server.store.errors.StoreError`."""
        settings = self._engine.settings
        started = 0
        async with self._claiming:
            while (free := min(self._max_running - self._slots, _CLAIM_BATCH)) > 0:
                if self._engine.draining:
                    break  # a stopping replica takes on no new work
                self._slots += free  # held while the claim runs, so submit() cannot overshoot
                try:
                    now = dt.datetime.now(dt.UTC)
                    until = now + dt.timedelta(seconds=settings.durability.lease_seconds)
                    claimed = await self._store.claim_pending_submissions(
                        settings.replica_id, now, until, free
                    )
                finally:
                    self._slots -= free
                starting = {r.submission_id: self._take(r.submission_id) for r in claimed}
                try:
                    for record in claimed:
                        if self._engine.handle(record.submission_id) is None:
                            self._slots += 1
                            await self._start(record)
                            started += 1
                        self._started(record.submission_id, starting.pop(record.submission_id))
                finally:
                    for submission_id, event in starting.items():
                        self._started(submission_id, event)
                if len(claimed) < free:
                    self._missed = False  # none left unclaimed
                    break
            else:
                self._missed = True  # full: more may wait, the next free slot looks
        return started

    async def serve(self) -> None:
        """Claim whenever another replica offers a submission or, after one was missed for want
        of a slot, a slot frees (runs until cancelled; failures are logged, the lease tick
        retries)."""
        follow = asyncio.create_task(self._follow_offers(), name="submission offers")
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                try:
                    if started := await self.claim():
                        log.info("claimed %d pending submission(s)", started)
                except Exception as error:
                    log.error("claiming pending submissions failed: %s", error)
        finally:
            await cancelled(follow)

    async def _follow_offers(self) -> None:
        async for _ in self._store.submission_offers():
            self._missed = True
            self._wake.set()
