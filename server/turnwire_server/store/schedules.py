"""Schedules in the store: their records, the store's role for them, and their errors
(docs/schedules.md).

A schedule is a row the store keeps opaque but for what a fire needs: its state, when it fires
next (``next_fire_at``), what its fires made (counts, the last submission). Each fire is a
submission, created by :meth:`ScheduleStore.fire_due_schedules` in the same transaction that
moves the schedule's ``next_fire_at`` on: a fire is claimed by exactly one replica (the row is
read ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, then changed only while ``next_fire_at`` is
still the time that was read), and a fire whose transaction did not commit made nothing, so the
next poll (of any replica) makes it. What a fire submits and when it fires next is decided by
the caller's plan (:data:`FirePlan`; the engine's ``engine/schedules.py``), a pure function
the store calls inside the transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from turnwire.errors import CanonicalCode, ErrorDetails
from turnwire_client.v1 import error_reason_pb2 as reasons
from turnwire_server.store.errors import StoreRefusal
from turnwire_server.store.records import SubmissionRecord

__all__ = [
    "FirePlan",
    "ScheduleExists",
    "ScheduleFire",
    "ScheduleNotFound",
    "ScheduleRecord",
    "ScheduleState",
    "ScheduleStore",
]

ScheduleState = Literal["active", "paused", "completed"]
"""``active`` fires at ``next_fire_at``; ``paused`` does not fire until resumed; ``completed``
never fires again (a single time that fired, a cron expression with no time left)."""


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One schedule. Times tz-aware UTC.

    ``schedule_id`` is the key (with the tenant's prefix, as conversation keys carry it:
    api/tenancy.py); ``spec`` what the API layer stored (a serialized ``turnwire.v1.Schedule``
    holding the timing, the input and the policies; opaque to the store); ``next_fire_at``
    None once it will not fire again; ``fire_count`` the submissions its fires made,
    ``skipped_count`` the fires that made none; ``last_fire_at`` the due time of its last fire
    and ``last_submission_id`` the submission that fire made; ``principal`` who created it (its
    fires' submissions run under that principal's budgets, docs/cost.md).
    """

    schedule_id: str
    state: ScheduleState
    spec: bytes
    next_fire_at: dt.datetime | None
    create_time: dt.datetime
    update_time: dt.datetime
    fire_count: int = 0
    skipped_count: int = 0
    last_fire_at: dt.datetime | None = None
    last_submission_id: str = ""
    principal: str = ""


@dataclass(frozen=True, slots=True)
class ScheduleFire:
    """What one due schedule does now, as its plan decided: ``submission`` to create (None: this
    fire makes none), ``fire_at`` the due time it stands for (recorded as ``last_fire_at`` when
    it submits), ``next_fire_at`` (None: it will not fire again, the schedule completes) and
    ``skipped`` how many fires made no submission (overlap, missed while no replica was up)."""

    submission: SubmissionRecord | None
    fire_at: dt.datetime
    next_fire_at: dt.datetime | None
    skipped: int = 0


FirePlan = Callable[[ScheduleRecord, bool, dt.datetime], ScheduleFire]
"""``plan(schedule, previous_open, now)``: what a due schedule does at ``now``;
``previous_open`` is whether the submission of its last fire is still pending or running. Pure
and quick: the store calls it inside the fire's transaction."""


@runtime_checkable
class ScheduleStore(Protocol):
    """Schedules and their fires (docs/schedules.md)."""

    max_open_submissions: int
    """The bound on a conversation's open submissions a fire's submission meets (the
    application sets SubmitMessages' ``durability.max_pending_submissions_per_conversation``)."""

    async def create_schedule(self, schedule: ScheduleRecord) -> ScheduleRecord:
        """Store a new schedule; returns it as stored. Raises :class:`ScheduleExists` (storing
        nothing) when its id is taken."""
        ...

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or None."""
        ...

    async def list_schedules(
        self, page_size: int, page_token: str, *, id_prefix: str = ""
    ) -> tuple[list[ScheduleRecord], str]:
        """One page (``page_size`` >= 1) of the schedules whose id starts with ``id_prefix`` (the
        caller's tenant), by id; the next page token ("" on the last page). Raises
        :class:`InvalidPageToken` for a token not issued for this prefix."""
        ...

    async def set_schedule_state(
        self,
        schedule_id: str,
        state: ScheduleState,
        next_fire_at: dt.datetime | None,
        *,
        only_from: ScheduleState,
    ) -> ScheduleRecord | None:
        """Pause or resume: set ``state`` and ``next_fire_at`` when the schedule is ``only_from``;
        returns the record as stored afterwards (changed or not), None when there is none."""
        ...

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule (its submissions stay); False when there was none."""
        ...

    async def fire_due_schedules(self, now: dt.datetime, limit: int, plan: FirePlan) -> list[ScheduleFire]:
        """Fire up to ``limit`` (>= 1) active schedules due at ``now`` (``next_fire_at <= now``),
        the most overdue first, in one transaction: each schedule's row is claimed
        (another replica firing at the same moment skips it), ``plan`` decides, the submission it
        makes is created as :meth:`SubmissionStore.create_submission` creates one (unclaimed:
        any replica's claim runs it), and the schedule's ``next_fire_at``, counts and last fire
        move on, all or nothing. A submission refused for the conversation's open submissions
        (:class:`TooManySubmissions`) counts as a skipped fire. Returns what fired."""
        ...


class ScheduleNotFound(StoreRefusal):
    """No schedule has this id (``NOT_FOUND``)."""

    error_reason = reasons.ERROR_REASON_SCHEDULE_NOT_FOUND
    status_code = CanonicalCode.NOT_FOUND

    def __init__(self, schedule_id: str) -> None:
        super().__init__(
            f"no schedule {schedule_id!r}; check the id CreateSchedule returned or ListSchedules"
        )
        self.schedule_id = schedule_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"schedule_id": self.schedule_id})


class ScheduleExists(StoreRefusal):
    """CreateSchedule named an id already in use (``ALREADY_EXISTS``)."""

    error_reason = reasons.ERROR_REASON_SCHEDULE_EXISTS
    status_code = CanonicalCode.ALREADY_EXISTS

    def __init__(self, schedule_id: str) -> None:
        super().__init__(
            f"schedule {schedule_id!r} already exists; choose another schedule_id or leave it empty"
        )
        self.schedule_id = schedule_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"schedule_id": self.schedule_id})
