"""Schedules: each fire is a submission, made exactly once across replicas and restarts
(docs/schedules.md).

Every replica runs a :class:`Scheduler`, a loop that wakes every ``schedules.poll_interval_seconds``
(sooner when a schedule is created or resumed on it) and asks the store to fire what is due
(:meth:`~turnwire_server.store.schedules.ScheduleStore.fire_due_schedules`). The store claims
each due schedule's row, calls :func:`plan_fire` and creates the fire's submission in the same
transaction that moves the schedule's next fire time on, so a fire is made by one replica, once;
a replica that dies mid-poll made nothing, and the next poll (its own after a restart, or
another replica's) makes the fire. The submission is then an ordinary one: the replica that
fired claims and runs it if it has a free slot (:meth:`Submissions.claim`), else any replica
does, FIFO with the conversation's other turns, with hooks, budgets and recovery as for
``SubmitMessages``. Nothing here is on a turn's path.

The loop is the only cost of schedules at rest: one indexed read per poll and replica.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from turnwire_server.engine.ids import RESERVED_PREFIX
from turnwire_server.engine.schedule_times import ScheduleTiming
from turnwire_server.event_waits import cancelled, set_within
from turnwire_server.store.records import SubmissionRecord
from turnwire_server.store.schedules import ScheduleFire, ScheduleRecord, ScheduleStore

__all__ = [
    "MissedRunsPolicy",
    "OverlapPolicy",
    "ScheduleSpec",
    "Scheduler",
    "fire_submission_id",
    "plan_fire",
]

log = logging.getLogger("turnwire.schedules")

OverlapPolicy = Literal["skip", "enqueue"]
MissedRunsPolicy = Literal["skip", "run_once"]

_FIRE_BATCH = 100


def fire_submission_id(schedule_id: str, fire_number: int) -> str:
    """The submission id of fire ``fire_number`` (from 1) of schedule ``schedule_id`` (a key):
    ``<schedule id>.<n>``, with ``tw-`` put before a client-chosen id, under the key's tenant
    prefix. A server id (``tw-``) no client can submit under, and one per fire: a fire made
    twice would find its submission stored (docs/schedules.md, "Exactly once")."""
    prefix, separator, local = schedule_id.rpartition("/")
    head = f"{prefix}{separator}"
    if not local.startswith(RESERVED_PREFIX):
        local = RESERVED_PREFIX + local
    return f"{head}{local}.{fire_number}"


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What the engine needs of a stored schedule: its ``timing``, its policies, and
    ``submission(fire_number, fire_at, now)``, the submission record of one fire (the API layer
    builds it from the schedule's input, :mod:`turnwire_server.api.schedule_rpcs`)."""

    timing: ScheduleTiming
    overlap: OverlapPolicy
    missed: MissedRunsPolicy
    submission: Callable[[int, dt.datetime, dt.datetime], SubmissionRecord]


def plan_fire(
    schedule: ScheduleRecord,
    spec: ScheduleSpec,
    previous_open: bool,
    now: dt.datetime,
    *,
    grace: dt.timedelta,
) -> ScheduleFire:
    """What a due ``schedule`` does at ``now`` (docs/schedules.md, "Overlap" and "Missed fires").

    On time (due no more than ``grace`` ago): it submits, unless its previous submission is
    still open (``previous_open``) and its overlap policy is ``skip``; then it fires next at
    its first time after the one due (a poll that came late makes the fires it missed one by
    one, each on its next poll). Later than ``grace``: the fires since were missed while no
    replica was up; ``skip`` makes none of them, ``run_once`` makes one (standing for the last
    missed time); either way it fires next at its first time after ``now``.
    """
    due = schedule.next_fire_at
    assert due is not None  # a due schedule has one
    number = schedule.fire_count + 1
    if now - due > grace:
        missed, last = spec.timing.times_until(due, now)
        following = spec.timing.first_after(now)
        if spec.missed == "run_once" and not (previous_open and spec.overlap == "skip"):
            return ScheduleFire(spec.submission(number, last, now), last, following, skipped=missed - 1)
        return ScheduleFire(None, last, following, skipped=missed)
    following = spec.timing.first_after(due)
    if previous_open and spec.overlap == "skip":
        return ScheduleFire(None, due, following, skipped=1)
    return ScheduleFire(spec.submission(number, due, now), due, following)


class Scheduler:
    """This replica's schedule loop (see the module docstring).

    ``spec_of(record)`` decodes a stored schedule (the API layer wrote it and checked it then; one
    that no longer decodes fails the poll, logged, and is retried by the next);
    ``claim`` starts the submissions fires made (:meth:`Submissions.claim`);
    ``poll_interval_seconds`` (> 0) bounds how long a due fire waits for a poll;
    ``misfire_grace_seconds`` (>= 0) is how late a fire may be made before it counts as missed.
    """

    def __init__(
        self,
        store: ScheduleStore,
        *,
        spec_of: Callable[[ScheduleRecord], ScheduleSpec],
        claim: Callable[[], Awaitable[int]],
        poll_interval_seconds: float,
        misfire_grace_seconds: float,
    ) -> None:
        if poll_interval_seconds <= 0:
            raise ValueError(f"poll_interval_seconds must be > 0, got {poll_interval_seconds}")
        self._store = store
        self._spec_of = spec_of
        self._claim = claim
        self._interval = poll_interval_seconds
        self._grace = dt.timedelta(seconds=misfire_grace_seconds)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Poll now (a schedule was created or resumed on this replica)."""
        self._wake.set()

    def start(self) -> None:
        """Run the loop in the background until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="scheduler")

    async def stop(self) -> None:
        """Stop the loop (a poll under way is cancelled: its transaction does not commit, so its
        fires are made by the next poll of whichever replica)."""
        if self._task is not None:
            await cancelled(self._task)
            self._task = None

    def _plan(self, schedule: ScheduleRecord, previous_open: bool, now: dt.datetime) -> ScheduleFire:
        return plan_fire(schedule, self._spec_of(schedule), previous_open, now, grace=self._grace)

    async def poll(self) -> list[ScheduleFire]:
        """Fire what is due now, then start the submissions made; returns the fires. Raises
        :class:`~turnwire_server.store.errors.StoreError`."""
        fired: list[ScheduleFire] = []
        while True:
            batch = await self._store.fire_due_schedules(dt.datetime.now(dt.UTC), _FIRE_BATCH, self._plan)
            fired.extend(batch)
            if len(batch) < _FIRE_BATCH:
                break
        if any(fire.submission is not None for fire in fired):
            await self._claim()
        return fired

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                fired = await self.poll()
                made = sum(fire.submission is not None for fire in fired)
                if made:
                    log.info("schedules: %d fire(s) made %d submission(s)", len(fired), made)
                if failing:
                    log.info("schedules: firing again")
                failing = False
            except Exception as error:  # the store away, a schedule that cannot be read: next poll
                # Once per outage, not once per poll: a poll a second would flood the log.
                log.log(logging.DEBUG if failing else logging.ERROR, "schedules: firing failed: %s", error)
                failing = True
            await set_within(self._wake, self._interval)
            self._wake.clear()
