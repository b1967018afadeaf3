"""Schedules in the store, on every backend (docs/schedules.md): the rows, the tenant-scoped
listing, pause and resume, and fires: each one's submission created in the transaction that
moves the schedule on, once, whichever store (replica) fires."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest
from support.stores import StoreBackend

from turnwire_server.store import InvalidPageToken, Store
from turnwire_server.store.records import SubmissionRecord
from turnwire_server.store.schedules import ScheduleExists, ScheduleFire, ScheduleRecord

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
STEP = dt.timedelta(seconds=2)


def _schedule(sid: str, at: dt.datetime | None = T0) -> ScheduleRecord:
    return ScheduleRecord(sid, "active", b"spec", at, T0, T0, principal="alice")


def _plan(conversation: str = "c") -> object:
    """A plan firing every STEP, on ``conversation``, its submission named by the fire number."""

    def plan(schedule: ScheduleRecord, previous_open: bool, now: dt.datetime) -> ScheduleFire:
        assert schedule.next_fire_at is not None
        number = schedule.fire_count + 1
        submission = SubmissionRecord(
            submission_id=f"tw-{schedule.schedule_id}.{number}",
            conversation_id=conversation,
            idempotency_key=None,
            state="pending",
            request=b"r",
            create_time=now,
            principal=schedule.principal,
        )
        return ScheduleFire(submission, schedule.next_fire_at, schedule.next_fire_at + STEP)

    return plan


async def test_a_schedule_is_stored_listed_by_tenant_paused_resumed_and_deleted(store: Store) -> None:
    stored = await store.create_schedule(_schedule("acme/b"))
    assert (stored.state, stored.next_fire_at, stored.principal, stored.fire_count) == (
        "active",
        T0,
        "alice",
        0,
    )
    with pytest.raises(ScheduleExists):
        await store.create_schedule(_schedule("acme/b"))
    for sid in ("acme/a", "acme/c", "other/a", "acme-x"):
        await store.create_schedule(_schedule(sid))
    first, token = await store.list_schedules(2, "", id_prefix="acme/")
    second, last = await store.list_schedules(2, token, id_prefix="acme/")
    assert [s.schedule_id for s in first + second] == ["acme/a", "acme/b", "acme/c"]
    assert last == ""
    with pytest.raises(InvalidPageToken):  # another tenant's token is nobody's
        await store.list_schedules(2, token, id_prefix="other/")
    paused = await store.set_schedule_state("acme/b", "paused", None, only_from="active")
    assert paused is not None and (paused.state, paused.next_fire_at) == ("paused", None)
    again = await store.set_schedule_state("acme/b", "paused", None, only_from="active")
    assert again == paused  # pausing a paused schedule changes nothing
    later = T0 + dt.timedelta(hours=1)
    resumed = await store.set_schedule_state("acme/b", "active", later, only_from="paused")
    assert resumed is not None and (resumed.state, resumed.next_fire_at) == ("active", later)
    assert await store.delete_schedule("acme/b") is True
    assert await store.delete_schedule("acme/b") is False
    assert await store.get_schedule("acme/b") is None
    assert await store.set_schedule_state("acme/b", "paused", None, only_from="active") is None


async def test_a_fire_creates_its_submission_and_moves_the_schedule_on(store: Store) -> None:
    await store.create_schedule(_schedule("s"))
    await store.create_schedule(_schedule("later", T0 + dt.timedelta(days=1)))
    await store.create_schedule(_schedule("paused"))
    await store.set_schedule_state("paused", "paused", None, only_from="active")
    fires = await store.fire_due_schedules(T0 + dt.timedelta(seconds=5), 10, _plan())  # type: ignore[arg-type]
    assert [f.submission.submission_id for f in fires if f.submission] == ["tw-s.1"]
    record = await store.get_schedule("s")
    assert record is not None
    assert (record.fire_count, record.next_fire_at, record.last_fire_at) == (1, T0 + STEP, T0)
    assert record.last_submission_id == "tw-s.1"
    submission = await store.get_submission("tw-s.1")
    assert submission is not None and (submission.state, submission.owner, submission.principal) == (
        "pending",
        "",
        "alice",
    )
    # Due again (T0 + 2 s <= now): the next fire, in order.
    await store.fire_due_schedules(T0 + dt.timedelta(seconds=5), 10, _plan())  # type: ignore[arg-type]
    listed, _ = await store.list_submissions(10, "", conversation_id="c")
    assert [s.submission_id for s in listed] == ["tw-s.1", "tw-s.2"]


async def test_a_fire_past_the_open_submission_limit_is_skipped(store_backend: StoreBackend) -> None:
    store = store_backend.new_store()
    await store.open()
    try:
        store.max_open_submissions = 1
        await store.create_schedule(_schedule("s"))
        now = T0 + dt.timedelta(seconds=30)
        await store.fire_due_schedules(now, 10, _plan())  # type: ignore[arg-type]
        (fire,) = await store.fire_due_schedules(now, 10, _plan())  # type: ignore[arg-type]
        assert fire.submission is None and fire.skipped == 1
        record = await store.get_schedule("s")
        assert record is not None and (record.fire_count, record.skipped_count) == (1, 1)
        assert record.next_fire_at == T0 + 2 * STEP  # it moved on all the same
    finally:
        await store.close()


async def test_a_fire_repeated_under_its_number_creates_nothing_twice(store: Store) -> None:
    await store.create_schedule(_schedule("s"))
    await store.fire_due_schedules(T0, 10, _plan())  # type: ignore[arg-type]
    # Rewind the schedule as if its first fire's update were lost: the fire's submission id finds
    # the stored submission and none is created.
    await store.set_schedule_state("s", "paused", None, only_from="active")
    await store.set_schedule_state("s", "active", T0, only_from="paused")
    stored = await store.get_schedule("s")
    assert stored is not None

    def replay(schedule: ScheduleRecord, previous_open: bool, now: dt.datetime) -> ScheduleFire:
        fire = _plan()(dataclasses.replace(schedule, fire_count=0), previous_open, now)  # type: ignore[operator]
        return fire  # type: ignore[no-any-return]

    (fire,) = await store.fire_due_schedules(T0, 10, replay)
    assert fire.submission is None
    listed, _ = await store.list_submissions(10, "", conversation_id="c")
    assert [s.submission_id for s in listed] == ["tw-s.1"]


async def test_stores_firing_at_once_make_each_fire_once(store_backend: StoreBackend) -> None:
    """Several stores (replicas on PostgreSQL; one writer on SQLite) poll the same due schedules
    at the same moment: each fire is claimed by one of them."""
    if store_backend.name == "sqlite":
        stores = [store_backend.new_store()]
    else:
        stores = [store_backend.new_store() for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        for n in range(20):
            await stores[0].create_schedule(_schedule(f"s{n:02d}"))
        now = T0 + dt.timedelta(seconds=1)
        results = await asyncio.gather(
            *(s.fire_due_schedules(now, 10, _plan(f"c{i}")) for i, s in enumerate(stores * 3))  # type: ignore[arg-type]
        )
        made = [f.submission.submission_id for batch in results for f in batch if f.submission]
        assert len(made) == len(set(made)) == 20
        listed, _ = await stores[0].list_submissions(100, "")
        assert sorted(s.submission_id for s in listed) == sorted(made)
        for n in range(20):
            record = await stores[0].get_schedule(f"s{n:02d}")
            assert record is not None and record.fire_count <= 1
            assert record.fire_count == sum(1 for m in made if m == f"tw-s{n:02d}.1")
    finally:
        for s in stores:
            await s.close()
