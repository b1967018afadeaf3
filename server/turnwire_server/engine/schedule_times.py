"""When a schedule fires (docs/schedules.md, "Timing"): a cron expression read in an IANA time
zone, or a single time.

Cron expressions are cronsim's (the evaluator Healthchecks runs): five fields, or six with
seconds first, read as Debian's cron reads them, DST included (a time skipped by a spring-forward
fires right after the jump; a time repeated by a fall-back fires once). Time zones are the
standard library's ``zoneinfo`` (the system's tz database, else the ``tzdata`` package).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass
from typing import Final

from cronsim import CronSim, CronSimError

__all__ = ["MAX_COUNTED_FIRES", "ScheduleTiming", "TimingError"]

MAX_COUNTED_FIRES: Final = 10_000
"""How many missed fire times :meth:`ScheduleTiming.times_until` counts at most (a schedule
every second stopped for a day would otherwise walk 86,400 times inside a transaction)."""


class TimingError(ValueError):
    """A cron expression or time zone that cannot be used; ``field`` names the request field
    (``cron``, ``time_zone``, ``fire_time``) and the message says what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class ScheduleTiming:
    """A schedule's fire times: ``cron`` in ``time_zone`` ("" means UTC), or the single
    ``fire_time`` (tz-aware) when ``cron`` is empty. Build it with :meth:`of`, which validates."""

    cron: str
    time_zone: str
    fire_time: dt.datetime | None

    @classmethod
    def of(cls, cron: str, time_zone: str, fire_time: dt.datetime | None) -> ScheduleTiming:
        """A validated timing. Raises :class:`TimingError` for both or neither of ``cron`` and
        ``fire_time``, a cron expression cronsim refuses (its reason quoted), or a time zone the
        tz database does not know."""
        if bool(cron.strip()) == (fire_time is not None):
            raise TimingError(
                "cron", "set exactly one of cron (a repeating schedule) and fire_time (a single time)"
            )
        if fire_time is not None:
            if time_zone:
                raise TimingError(
                    "time_zone", "applies to cron only; a fire_time is an instant, leave it empty"
                )
            if fire_time.tzinfo is None:
                raise TimingError("fire_time", "must be a timezone-aware time")
            return cls("", "", fire_time)
        zone = _zone(time_zone)
        try:
            CronSim(cron, dt.datetime.now(zone))
        except CronSimError as error:
            raise TimingError(
                "cron",
                f"{cron!r} is not a cron expression ({error}); use five fields (minute hour day-of-month "
                "month day-of-week) or six with seconds first, e.g. '0 9 * * MON-FRI' or '*/5 * * * * *'",
            ) from None
        return cls(cron.strip(), time_zone, None)

    def first_after(self, after: dt.datetime) -> dt.datetime | None:
        """The first fire time strictly after ``after`` (tz-aware), in UTC; None when there is
        none (a single time at or before ``after``; a cron expression that matches nothing in
        the next 50 years, as cronsim gives up then)."""
        if self.fire_time is not None:
            return self.fire_time.astimezone(dt.UTC) if self.fire_time > after else None
        start = after.astimezone(_zone(self.time_zone))
        try:
            return next(CronSim(self.cron, start)).astimezone(dt.UTC)
        except StopIteration:
            return None

    def first_at_or_after(self, at: dt.datetime) -> dt.datetime | None:
        """The first fire time at or after ``at``: a schedule's first fire."""
        return self.first_after(at - dt.timedelta(microseconds=1))

    def times_until(self, first: dt.datetime, now: dt.datetime) -> tuple[int, dt.datetime]:
        """How many fire times from ``first`` (itself one) up to ``now`` inclusive, counting at
        most :data:`MAX_COUNTED_FIRES`, and the last of them."""
        count, last = 1, first
        if self.fire_time is not None:
            return count, last
        times = CronSim(self.cron, first.astimezone(_zone(self.time_zone)))  # one walk, parsed once
        for following in times:
            if count >= MAX_COUNTED_FIRES or following > now:
                break
            count, last = count + 1, following.astimezone(dt.UTC)
        return count, last


def _zone(name: str) -> zoneinfo.ZoneInfo | dt.timezone:
    if not name:
        return dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise TimingError(
            "time_zone", f"{name!r} is not an IANA time zone; use a name such as 'Europe/Paris' or 'UTC'"
        ) from None
