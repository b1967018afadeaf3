"""Schedules on three PostgreSQL replicas (issue 41, docs/schedules.md): every replica polls, each
fire is made once, in order, and runs as a turn; pause and resume; a full stop of every replica,
after which the missed-runs policy decides (RUN_ONCE: one fire for the gap; SKIP: none), with
every cron time accounted for exactly once (fired or skipped).

Size: ``TURNWIRE_STRESS_SCALE`` (default 1: about 5 s of fires every second; ``make stress``:
a minute).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from pathlib import Path

from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import postgres_database
from support.waiting import wait_until

from turnwire_client import TurnwireClient
from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.engine.schedule_times import ScheduleTiming

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
RUN_SECONDS = min(5 * SCALE, 60)
GRACE_SECONDS = 1.5
CONFIG = {
    "default_model": "scripted:echo",
    "providers": {"scripted": {"scripts": {"echo": [{"text": "tick"}]}}},
    "schedules": {"poll_interval_seconds": 0.2, "misfire_grace_seconds": GRACE_SECONDS},
    "store": {"pool_size": 5},
}
START_SECONDS = 180.0
EVERY_SECOND = "* * * * * *"
EVERY_TWO = "*/2 * * * * *"


async def _start(factory: SidecarFactory, url: str, tmp_path: Path, round_: int) -> list[SidecarProcess]:
    replicas = [factory(CONFIG, workdir=tmp_path / f"r{round_}-{n}", store_url=url) for n in range(3)]
    # Three starts at once on 2 cores: more patient than one start (they migrate together too).
    await asyncio.gather(*(replica.start(timeout=START_SECONDS) for replica in replicas))
    return replicas


def _accounted(cron: str, before: chat_service_pb2.Schedule, after: chat_service_pb2.Schedule) -> None:
    """Every cron time between the two readings' last fires was fired or skipped, once."""
    timing = ScheduleTiming.of(cron, "", None)
    start = before.last_fire_time.ToDatetime(dt.UTC)
    end = after.last_fire_time.ToDatetime(dt.UTC)
    times, _ = timing.times_until(timing.first_after(start) or end, end)
    made = (after.fire_count - before.fire_count) + (after.skipped_count - before.skipped_count)
    assert made == times, (before, after)


async def test_fires_once_in_order_across_replicas_pause_and_a_full_stop(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    with postgres_database() as url:
        replicas = await _start(sidecar_factory, url, tmp_path, 0)
        clients = [TurnwireClient(r.target) for r in replicas]
        try:
            a, b, c = clients
            await a.create_schedule("beats", "beat", cron=EVERY_SECOND, overlap="enqueue", schedule_id="beat")
            await b.create_schedule(
                "once", "o", cron=EVERY_TWO, overlap="enqueue", missed_runs="run_once", schedule_id="once"
            )
            await c.create_schedule(
                "skips", "s", cron=EVERY_TWO, overlap="enqueue", missed_runs="skip", schedule_id="skip"
            )

            async def fired(
                schedule_id: str, count: int, client: TurnwireClient = a
            ) -> chat_service_pb2.Schedule | None:
                schedule = await client.get_schedule(schedule_id)
                return schedule if schedule.fire_count >= count else None

            await wait_until(lambda: fired("beat", RUN_SECONDS), timeout=RUN_SECONDS * 4 + 30, interval=0.2)

            paused = await b.pause_schedule("beat")
            clock = await a.get_schedule("skip")
            # The every-two-seconds schedule is the clock: two of its fires later, every replica
            # polled many times while "beat" was paused.
            await wait_until(lambda: fired("skip", clock.fire_count + 2, c), interval=0.2)
            assert (await a.get_schedule("beat")).fire_count == paused.fire_count
            await c.resume_schedule("beat")
            await wait_until(lambda: fired("beat", paused.fire_count + 2, b), interval=0.2)

            before = {sid: await a.get_schedule(sid) for sid in ("once", "skip")}
            for client in clients:
                await client.close()
            await asyncio.gather(*(r.terminate() for r in replicas))  # a full stop: no replica up
            stopped = dt.datetime.now(dt.UTC)
            await wait_until(
                lambda: dt.datetime.now(dt.UTC) > stopped + dt.timedelta(seconds=3 * GRACE_SECONDS + 2),
                interval=0.1,
                what="the fires of the stop to be missed",
            )
            restarting = dt.datetime.now(dt.UTC)  # no replica is up before this
            replicas = await _start(sidecar_factory, url, tmp_path, 1)
            clients = [TurnwireClient(r.target) for r in replicas]
            a = clients[0]
            after: dict[str, chat_service_pb2.Schedule] = {}
            for sid in ("once", "skip"):
                wanted = before[sid].fire_count + 2
                found = await wait_until(lambda sid=sid, wanted=wanted: fired(sid, wanted, a), interval=0.2)  # type: ignore[misc]
                assert found is not None
                after[sid] = found
            every_two = ScheduleTiming.of(EVERY_TWO, "", None)
            gap, _ = every_two.times_until(every_two.first_after(stopped) or restarting, restarting)
            assert gap >= 2
            for sid in ("once", "skip"):
                _accounted(EVERY_TWO, before[sid], after[sid])
            # RUN_ONCE: the gap's fires became one (the rest skipped); SKIP: none of them ran.
            skipped_once = after["once"].skipped_count - before["once"].skipped_count
            skipped_skip = after["skip"].skipped_count - before["skip"].skipped_count
            assert skipped_once >= 1
            assert skipped_skip >= max(gap - 1, skipped_once)

            # Every fire of "beat" made one submission, each ran one turn, in fire order.
            beat = await a.get_schedule("beat")
            listed = (await a.list_submissions(conversation_id="beats", page_size=100)).submissions
            pages = list(listed)
            assert [s.submission_id for s in pages] == [f"tw-beat.{n}" for n in range(1, len(pages) + 1)]
            assert len(pages) >= beat.fire_count >= RUN_SECONDS  # later fires may have landed since
            turns = (await a.list_turns("beats", page_size=100)).turns
            completed = [t.request_id for t in reversed(turns) if t.status == event_pb2.TURN_STATUS_COMPLETED]
            assert completed == [f"tw-beat.{n}" for n in range(1, len(completed) + 1)]
            assert len(completed) >= beat.fire_count - 2  # the last fires may still be running
        finally:
            for client in clients:
                await client.close()
