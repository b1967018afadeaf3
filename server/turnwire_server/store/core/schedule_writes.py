"""Schedules in both stores (docs/schedules.md; the contract is
:class:`~turnwire_server.store.schedules.ScheduleStore`): the row codec, the write programs
(:mod:`.sql`) and :class:`CoreSchedules`, the mixin each driver's store class inherits with
:class:`~.writes.CoreWrites` and :class:`~.reads.CoreReads` (it runs on their ``_commit`` and
``_read``).

A fire is one program: claim the due rows (``claim_rows``: ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, so two replicas polling at once take different schedules; SQLite has one writer),
read whether each one's last submission is still open, let the caller's plan decide, create the
submission with :func:`~.submission_writes.create_submission`'s program and move the row on
with an update naming the ``next_fire_at`` that was read, all in one transaction. The row's lock,
held to the commit, is the claim (a pause waits for it); the fire's submission id is its own
(``tw-<schedule>.<fire number>``, the plan's), so even a fire made twice would find its
submission stored and create none (:func:`~.submission_writes.create_submission`'s idempotency).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any, Final, TypeVar, get_args

from turnwire_server.store.core import submission_writes
from turnwire_server.store.core.page_tokens import decode_schedule_token, encode_schedule_token
from turnwire_server.store.core.rows import time_from_us, to_us
from turnwire_server.store.core.sql import Dialect, Program, Statement
from turnwire_server.store.core.submission_rows import PREFIX_FILTER
from turnwire_server.store.core.writes import ALONE, Commit
from turnwire_server.store.errors import TooManySubmissions
from turnwire_server.store.schedules import (
    FirePlan,
    ScheduleExists,
    ScheduleFire,
    ScheduleRecord,
    ScheduleState,
)

__all__ = ["SCHEDULE_COLUMNS", "CoreSchedules", "schedule_from_row"]

T = TypeVar("T")

SCHEDULE_COLUMNS: Final = (
    "id, state, spec, next_fire_at, create_time, update_time, fire_count, skipped_count, last_fire_at,"
    " last_submission_id, principal"
)
"""The columns :func:`schedule_from_row` reads, in its order."""

_STATES: Final[frozenset[str]] = frozenset(get_args(ScheduleState))
_BY_ID: Final = f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?"
_MAX_OPEN_SUBMISSIONS_DEFAULT: Final = 1000


def schedule_from_row(row: Any) -> ScheduleRecord:
    """A row of :data:`SCHEDULE_COLUMNS` as a :class:`ScheduleRecord`."""
    if row[1] not in _STATES:
        raise ValueError(f"schedule {row[0]!r} has unknown state {row[1]!r} in the database")
    create, update = time_from_us(row[4]), time_from_us(row[5])
    assert create is not None and update is not None  # NOT NULL columns
    return ScheduleRecord(
        schedule_id=row[0],
        state=row[1],
        spec=bytes(row[2]),
        next_fire_at=time_from_us(row[3]),
        create_time=create,
        update_time=update,
        fire_count=row[6],
        skipped_count=row[7],
        last_fire_at=time_from_us(row[8]),
        last_submission_id=row[9] or "",
        principal=row[10] or "",
    )


def _opt_us(value: dt.datetime | None, what: str) -> int | None:
    return None if value is None else to_us(value, what)


def _create(record: ScheduleRecord) -> Program[ScheduleRecord]:
    found = yield [Statement(_BY_ID, (record.schedule_id,), fetch=True)]
    if found[0]:
        raise ScheduleExists(record.schedule_id)
    written = yield [
        Statement(
            "INSERT INTO schedules (id, state, spec, next_fire_at, fire_count, skipped_count, principal,"
            " create_time, update_time) VALUES (?, ?, ?, ?, 0, 0, ?, ?, ?)",
            (
                record.schedule_id,
                record.state,
                record.spec,
                _opt_us(record.next_fire_at, "next_fire_at"),
                record.principal or None,
                to_us(record.create_time, "create_time"),
                to_us(record.update_time, "update_time"),
            ),
        ),
        Statement(_BY_ID, (record.schedule_id,), fetch=True),
    ]
    return schedule_from_row(written[1][0])


def _set_state(
    schedule_id: str, state: ScheduleState, next_us: int | None, only_from: ScheduleState, now_us: int
) -> Program[ScheduleRecord | None]:
    done = yield [
        Statement(
            "UPDATE schedules SET state = ?, next_fire_at = ?, update_time = ? WHERE id = ? AND state = ?",
            (state, next_us, now_us, schedule_id, only_from),
        ),
        Statement(_BY_ID, (schedule_id,), fetch=True),
    ]
    return schedule_from_row(done[1][0]) if done[1] else None


def _delete(schedule_id: str) -> Program[bool]:
    found = yield [
        Statement("SELECT id FROM schedules WHERE id = ?", (schedule_id,), fetch=True),
        Statement("DELETE FROM schedules WHERE id = ?", (schedule_id,)),
    ]
    return bool(found[0])


def _fire_due(
    now: dt.datetime, limit: int, plan: FirePlan, *, max_open: int, dialect: Dialect, now_us: int
) -> Program[list[ScheduleFire]]:
    """One transaction's fires (see the module docstring)."""
    due = yield [
        Statement(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE state = 'active' AND next_fire_at <= ?"
            " ORDER BY next_fire_at, id LIMIT ?" + dialect.claim_rows,
            (to_us(now, "now"), limit),
            fetch=True,
        )
    ]
    schedules = [schedule_from_row(row) for row in due[0]]
    if not schedules:
        return []
    previous = yield [
        Statement("SELECT state FROM submissions WHERE id = ?", (s.last_submission_id,), fetch=True)
        for s in schedules
    ]
    fires: list[ScheduleFire] = []
    for schedule, rows in zip(schedules, previous, strict=True):
        fire = plan(schedule, bool(rows) and rows[0][0] in submission_writes.OPEN, now)
        submitted = ""
        if fire.submission is not None:
            try:
                stored, created = yield from submission_writes.create_submission(
                    fire.submission, max_open, dialect
                )
            except TooManySubmissions:  # its reads only: nothing was written
                fire = dataclasses.replace(fire, submission=None, skipped=fire.skipped + 1)
            else:
                if created:
                    submitted = stored.submission_id
                else:  # its id is the fire's own: this fire was made already, never twice
                    fire = dataclasses.replace(fire, submission=None)
        assert schedule.next_fire_at is not None  # a due schedule has one
        yield [
            Statement(
                "UPDATE schedules SET next_fire_at = ?, state = ?, update_time = ?,"
                " fire_count = fire_count + ?, skipped_count = skipped_count + ?,"
                " last_fire_at = CASE WHEN ? THEN ? ELSE last_fire_at END,"
                " last_submission_id = CASE WHEN ? THEN ? ELSE last_submission_id END"
                " WHERE id = ? AND state = 'active' AND next_fire_at = ?",
                (
                    _opt_us(fire.next_fire_at, "next_fire_at"),
                    "active" if fire.next_fire_at is not None else "completed",
                    now_us,
                    1 if submitted else 0,
                    fire.skipped,
                    bool(submitted),
                    to_us(fire.fire_at, "fire_at"),
                    bool(submitted),
                    submitted,
                    schedule.schedule_id,
                    to_us(schedule.next_fire_at, "next_fire_at"),
                ),
            )
        ]
        fires.append(fire)
    return fires


class CoreSchedules:
    """:class:`~turnwire_server.store.schedules.ScheduleStore` on a driver's ``_commit`` and
    ``_read`` (a mixin of the store classes)."""

    _dialect: Dialect
    max_open_submissions: int = _MAX_OPEN_SUBMISSIONS_DEFAULT
    """The bound on a conversation's open submissions a fire's submission meets, as
    SubmitMessages' (``durability.max_pending_submissions_per_conversation``; the application
    sets it)."""

    async def _commit(self, what: str, program: Callable[[int], Program[T]], how: Commit = ALONE) -> T:
        raise NotImplementedError

    async def _read(self, what: str, sql: str, params: Any) -> list[Any]:
        raise NotImplementedError

    async def create_schedule(self, schedule: ScheduleRecord) -> ScheduleRecord:
        if schedule.state not in _STATES:
            raise ValueError(f"unknown schedule state {schedule.state!r}")
        to_us(schedule.create_time, "create_time")  # a naive time fails here, before anything is queued
        return await self._commit(f"create_schedule({schedule.schedule_id!r})", lambda _: _create(schedule))

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        rows = await self._read("get_schedule", _BY_ID, (schedule_id,))
        return schedule_from_row(rows[0]) if rows else None

    async def list_schedules(
        self, page_size: int, page_token: str, *, id_prefix: str = ""
    ) -> tuple[list[ScheduleRecord], str]:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        where, params = list[str](), list[Any]()
        if id_prefix:
            where.append(PREFIX_FILTER.format(column="id", mark="?"))
            params.extend((len(id_prefix), id_prefix))
        if page_token:
            where.append("id > ?")
            params.append(decode_schedule_token(page_token, id_prefix))
        condition = f" WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(
            "list_schedules",
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules{condition} ORDER BY id LIMIT ?",
            (*params, page_size + 1),
        )
        records = [schedule_from_row(row) for row in rows[:page_size]]
        token = encode_schedule_token(records[-1].schedule_id, id_prefix) if len(rows) > page_size else ""
        return records, token

    async def set_schedule_state(
        self,
        schedule_id: str,
        state: ScheduleState,
        next_fire_at: dt.datetime | None,
        *,
        only_from: ScheduleState,
    ) -> ScheduleRecord | None:
        if state not in _STATES or only_from not in _STATES:
            raise ValueError(f"unknown schedule state {state!r} or {only_from!r}")
        next_us = _opt_us(next_fire_at, "next_fire_at")
        return await self._commit(
            f"set_schedule_state({schedule_id!r})",
            lambda now_us: _set_state(schedule_id, state, next_us, only_from, now_us),
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._commit(f"delete_schedule({schedule_id!r})", lambda _: _delete(schedule_id))

    async def fire_due_schedules(self, now: dt.datetime, limit: int, plan: FirePlan) -> list[ScheduleFire]:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        to_us(now, "now")
        fires = await self._commit(
            "fire_due_schedules",
            lambda now_us: _fire_due(
                now, limit, plan, max_open=self.max_open_submissions, dialect=self._dialect, now_us=now_us
            ),
        )
        locks = getattr(self, "_locks", None)
        if locks is not None:  # one process: the new submissions' places in their lines are here
            for fire in fires:
                if fire.submission is not None:
                    locks.reserve(fire.submission.conversation_id, fire.submission.submission_id)
        return fires
