"""Durable submissions: accepted at once, run later through the ordinary turn pipeline.

docs/semantics.md §7. A submission is stored (``pending``) before it is acknowledged; its turn
(request id = submission id) then queues on the conversation's turn lock like any other, so
submissions and blocking calls run first in, first out together. The turn's ``start_turn``
marks it ``running`` in the same transaction that appends its messages; its ``finish_turn``
ends it, never over ``aborted``. After a restart, pending submissions are started again in
acceptance order, and a running one is recovered with its turn (``TurnEngine.recover``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from turnwire_server.engine.engine import TurnEngine, TurnHandle
from turnwire_server.engine.errors import (
    AdmissionRefused,
    InputNotStored,
    SubmissionExpired,
    SubmissionNotFound,
)
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.turn import ErrorStatus
from turnwire_server.store.base import Store, SubmissionRecord, SubmissionState

log = logging.getLogger("turnwire.submissions")

_OPEN = ("pending", "running")
_CLAIM_BATCH = 500


class Submissions:
    """Accepts, starts, cancels and restarts submissions.

    ``turn_request(record)`` builds the turn of a stored submission (the API layer decodes
    its request); ``max_open`` bounds pending and running submissions per conversation;
    ``error_status`` maps an error to the ``google.rpc.Status`` stored with a submission.
    """

    def __init__(
        self,
        engine: TurnEngine,
        store: Store,
        *,
        turn_request: Callable[[SubmissionRecord], TurnRequest],
        max_open: int,
        error_status: ErrorStatus,
    ) -> None:
        self._engine = engine
        self._store = store
        self._turn_request = turn_request
        self._max_open = max_open
        self._error_status = error_status
        self._settling: set[asyncio.Task[None]] = set()

    async def submit(self, submission: SubmissionRecord) -> tuple[SubmissionRecord, bool]:
        """Store ``submission`` (or find the one it repeats) and, when new, start its turn.

        Returns the stored record and whether this call created it. Raises the store's
        :class:`~turnwire_server.store.base.SubmissionConflict`,
        :class:`~turnwire_server.store.base.TooManySubmissions` or
        :class:`~turnwire_server.store.base.StoreError`.
        """
        settings = self._engine.settings
        submission = dataclasses.replace(
            submission,
            owner=settings.replica_id,
            lease_until=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=settings.lease_seconds),
        )
        record, created = await self._store.create_submission(submission, max_open=self._max_open)
        if created:
            self._start(record)
        return record, created

    def _start(self, record: SubmissionRecord) -> None:
        try:
            handle = self._engine.start(self._turn_request(record), detached=True, queue_limit=False)
        except AdmissionRefused as error:
            # Shutting down: it stays pending and runs after the restart.
            log.warning("submission %s stays pending: %s", record.submission_id, error)
            return
        task = asyncio.create_task(self._settle(record, handle), name=f"submission {record.submission_id}")
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, record: SubmissionRecord, handle: TurnHandle) -> None:
        """A turn that ended before storing its input never moved its submission: end it here."""
        await asyncio.shield(handle.task)
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
        self._engine.cancel(submission_id)
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
            expired += len(ids)
            if len(ids) < batch:
                break
        return expired

    async def restart_pending(self) -> int:
        """Start the pending submissions whose replica died (at a start: with SQLite, every one a
        previous process accepted), in acceptance order, claiming them for this replica; called
        at start and on every lease tick (``engine.replica``). Running ones are the recovery's
        (their turns are ``running`` in the store). Returns how many started."""
        settings = self._engine.settings
        started = 0
        while True:
            now = dt.datetime.now(dt.UTC)
            until = now + dt.timedelta(seconds=settings.lease_seconds)
            claimed = await self._store.claim_pending_submissions(
                settings.replica_id, now, until, _CLAIM_BATCH
            )
            for record in claimed:
                if self._engine.handle(record.submission_id) is None:
                    self._start(record)
                    started += 1
            if len(claimed) < _CLAIM_BATCH:
                return started
