"""When a schedule fires and what a fire does (docs/schedules.md, "Timing", "Overlap", "Missed
fires"): cron expressions in time zones, single times, and the plan of a due schedule."""

from __future__ import annotations

import datetime as dt

import pytest

from turnwire_server.engine.schedule_times import ScheduleTiming, TimingError
from turnwire_server.engine.schedules import ScheduleSpec, fire_submission_id, plan_fire
from turnwire_server.store.records import SubmissionRecord
from turnwire_server.store.schedules import ScheduleRecord

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
GRACE = dt.timedelta(seconds=5)


def test_a_cron_expression_is_read_in_its_time_zone_across_dst() -> None:
    timing = ScheduleTiming.of("0 9 * * *", "Europe/Paris", None)
    # 9:00 in Paris is 08:00 UTC in winter and 07:00 UTC after the switch on 29 March 2026.
    assert timing.first_after(dt.datetime(2026, 3, 27, 9, tzinfo=dt.UTC)) == dt.datetime(
        2026, 3, 28, 8, tzinfo=dt.UTC
    )
    assert timing.first_after(dt.datetime(2026, 3, 28, 9, tzinfo=dt.UTC)) == dt.datetime(
        2026, 3, 29, 7, tzinfo=dt.UTC
    )


def test_six_fields_have_seconds_first_and_a_single_time_fires_once() -> None:
    every_two = ScheduleTiming.of("*/2 * * * * *", "", None)
    assert every_two.first_after(T0) == T0 + dt.timedelta(seconds=2)
    assert every_two.first_at_or_after(T0) == T0
    assert every_two.times_until(T0, T0 + dt.timedelta(seconds=9)) == (5, T0 + dt.timedelta(seconds=8))
    once = ScheduleTiming.of("", "", T0)
    assert once.first_after(T0 - dt.timedelta(seconds=1)) == T0
    assert once.first_after(T0) is None


@pytest.mark.parametrize(
    ("cron", "zone", "fire_time", "field"),
    [
        ("61 * * * *", "", None, "cron"),
        ("* * *", "", None, "cron"),
        ("* * * * *", "Mars/Olympus", None, "time_zone"),
        ("", "", None, "cron"),
        ("* * * * *", "", T0, "cron"),
        ("", "UTC", T0, "time_zone"),
    ],
)
def test_bad_timing_names_the_field_to_fix(
    cron: str, zone: str, fire_time: dt.datetime | None, field: str
) -> None:
    with pytest.raises(TimingError) as caught:
        ScheduleTiming.of(cron, zone, fire_time)
    assert caught.value.field == field
    assert str(caught.value)


def _spec(timing: ScheduleTiming, overlap: str = "enqueue", missed: str = "skip") -> ScheduleSpec:
    def submission(number: int, fire_at: dt.datetime, now: dt.datetime) -> SubmissionRecord:
        return SubmissionRecord(
            submission_id=f"tw-s.{number}",
            conversation_id="c",
            idempotency_key=None,
            state="pending",
            request=fire_at.isoformat().encode(),
            create_time=now,
        )

    return ScheduleSpec(timing=timing, overlap=overlap, missed=missed, submission=submission)  # type: ignore[arg-type]


def _due(at: dt.datetime, fired: int = 0) -> ScheduleRecord:
    return ScheduleRecord("s", "active", b"", at, T0, T0, fire_count=fired)


def test_an_on_time_fire_submits_and_moves_to_the_next_time() -> None:
    timing = ScheduleTiming.of("*/2 * * * * *", "", None)
    fire = plan_fire(_due(T0, fired=3), _spec(timing), False, T0 + dt.timedelta(seconds=1), grace=GRACE)
    assert fire.submission is not None and fire.submission.submission_id == "tw-s.4"
    assert (fire.fire_at, fire.next_fire_at, fire.skipped) == (T0, T0 + dt.timedelta(seconds=2), 0)


def test_overlap_skip_makes_no_submission_while_the_previous_run_is_open() -> None:
    timing = ScheduleTiming.of("*/2 * * * * *", "", None)
    skipped = plan_fire(_due(T0), _spec(timing, overlap="skip"), True, T0, grace=GRACE)
    assert (skipped.submission, skipped.skipped, skipped.next_fire_at) == (
        None,
        1,
        T0 + dt.timedelta(seconds=2),
    )
    queued = plan_fire(_due(T0), _spec(timing, overlap="enqueue"), True, T0, grace=GRACE)
    assert queued.submission is not None


def test_missed_fires_are_skipped_or_run_once_then_it_goes_on_after_now() -> None:
    timing = ScheduleTiming.of("*/2 * * * * *", "", None)
    now = T0 + dt.timedelta(seconds=61)  # due at 0, 2, …, 60: 31 fires missed
    skip = plan_fire(_due(T0), _spec(timing, missed="skip"), False, now, grace=GRACE)
    assert (skip.submission, skip.skipped, skip.next_fire_at) == (None, 31, T0 + dt.timedelta(seconds=62))
    once = plan_fire(_due(T0), _spec(timing, missed="run_once"), False, now, grace=GRACE)
    assert once.submission is not None and once.fire_at == T0 + dt.timedelta(seconds=60)
    assert (once.skipped, once.next_fire_at) == (30, T0 + dt.timedelta(seconds=62))


def test_a_single_time_completes_after_its_fire() -> None:
    fire = plan_fire(_due(T0), _spec(ScheduleTiming.of("", "", T0)), False, T0, grace=GRACE)
    assert fire.submission is not None and fire.next_fire_at is None


def test_a_fire_submission_id_is_the_servers_and_keeps_the_tenant() -> None:
    assert fire_submission_id("nightly", 7) == "tw-nightly.7"
    assert fire_submission_id("acme/nightly", 7) == "acme/tw-nightly.7"
    assert fire_submission_id("acme/tw-s-1f", 2) == "acme/tw-s-1f.2"
