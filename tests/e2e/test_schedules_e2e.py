"""Schedules on one ``turnwire serve`` with its SQLite store (docs/schedules.md): a cron schedule
fires submissions that run as turns, in order, a new conversation per run from a template; a
single time fires once and completes; pause stops the fires and resume starts them again; a
fire missed while the sidecar was stopped runs once after the restart (RUN_ONCE); bad timing is
INVALID_ARGUMENT with BadRequest; another tenant's schedule answers as one that does not exist;
the CLI drives the same RPCs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.sidecar import SidecarFactory, run_turnwire
from support.tokens import auth_config, new_token, write_tokens_file
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import chat_service_pb2

GRACE_SECONDS = 1.0
CONFIG = {
    "default_model": "scripted:echo",
    "providers": {"scripted": {"scripts": {"echo": [{"text": "tick"}]}}},
    "schedules": {"poll_interval_seconds": 0.2, "misfire_grace_seconds": GRACE_SECONDS},
}
TOKEN_A, TOKEN_B = new_token(), new_token()


async def _completed(client: TurnwireClient, schedule_id: str) -> list[chat_service_pb2.Submission]:
    page = await client.list_submissions(page_size=100)
    return [
        s
        for s in page.submissions
        if s.submission_id.startswith(f"tw-{schedule_id}.")
        and s.state == chat_service_pb2.SUBMISSION_STATE_COMPLETED
    ]


async def test_a_cron_schedule_fires_turns_in_order_and_pauses(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        created = await client.create_schedule(
            "", "ping", cron="* * * * * *", conversation_id_template="run-{fire_number}", schedule_id="every"
        )
        assert created.state == chat_service_pb2.SCHEDULE_STATE_ACTIVE and created.HasField("next_fire_time")
        done = await wait_until(lambda: _fires(client, "every", 3), what="three fires completed")
        assert done is not None
        assert [s.submission_id for s in done[:3]] == ["tw-every.1", "tw-every.2", "tw-every.3"]
        assert [s.conversation_id for s in done[:3]] == ["run-1", "run-2", "run-3"]
        transcript = await client.get_conversation("run-2")
        texts = [
            "".join(p.text.text for p in m.parts if p.WhichOneof("kind") == "text")
            for m in transcript.messages
        ]
        assert texts == ["ping", "tick"]

        paused = await client.pause_schedule("every")
        assert paused.state == chat_service_pb2.SCHEDULE_STATE_PAUSED and not paused.HasField(
            "next_fire_time"
        )
        # A single-time schedule a second out is the clock: once it fired, the paused one had
        # its chance to fire too.
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.5)
        await client.create_schedule("clock", "tock", fire_time=at, schedule_id="clock")
        await wait_until(lambda: _state(client, "clock", chat_service_pb2.SCHEDULE_STATE_COMPLETED))
        clock = await client.get_schedule("clock")
        assert (clock.fire_count, clock.last_submission_id) == (1, "tw-clock.1")
        assert (await client.get_schedule("every")).fire_count == paused.fire_count

        resumed = await client.resume_schedule("every")
        assert resumed.state == chat_service_pb2.SCHEDULE_STATE_ACTIVE
        await wait_until(lambda: _fires(client, "every", paused.fire_count + 2), what="fires after resume")
        listed = await client.list_schedules()
        assert [s.schedule_id for s in listed.schedules] == ["clock", "every"]
        assert await client.delete_schedule("every") is True
        with pytest.raises(TurnwireError) as missing:
            await client.get_schedule("every")
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        assert missing.value.reason == "SCHEDULE_NOT_FOUND"


async def _fires(
    client: TurnwireClient, schedule_id: str, count: int
) -> list[chat_service_pb2.Submission] | None:
    done = await _completed(client, schedule_id)
    return done if len(done) >= count else None


async def _state(client: TurnwireClient, schedule_id: str, state: int) -> bool:
    return (await client.get_schedule(schedule_id)).state == state


async def test_a_fire_missed_while_stopped_runs_once_after_the_restart(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sidecar_factory(CONFIG, workdir=tmp_path).start()
    async with TurnwireClient(sidecar.target) as client:
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
        await client.create_schedule("late", "ping", fire_time=at, missed_runs="run_once", schedule_id="once")
        await client.create_schedule(
            "late-skip", "ping", fire_time=at, missed_runs="skip", schedule_id="skip"
        )
    await sidecar.terminate()
    # Stopped past the fire time and the grace: no replica was up to make it.
    await wait_until(
        lambda: dt.datetime.now(dt.UTC) > at + dt.timedelta(seconds=2 * GRACE_SECONDS), interval=0.1
    )
    restarted = await sidecar_factory(CONFIG, workdir=tmp_path).start()
    async with TurnwireClient(restarted.target) as client:
        await wait_until(lambda: _state(client, "once", chat_service_pb2.SCHEDULE_STATE_COMPLETED))
        await wait_until(lambda: _state(client, "skip", chat_service_pb2.SCHEDULE_STATE_COMPLETED))
        once, skip = await client.get_schedule("once"), await client.get_schedule("skip")
        assert (once.fire_count, once.skipped_count) == (1, 0)
        assert (skip.fire_count, skip.skipped_count) == (0, 1)
        await wait_until(lambda: _fires(client, "once", 1), what="the missed fire's turn")


async def test_bad_timing_is_invalid_argument_with_the_field(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"cron": "61 * * * *"}, "schedule.cron"),
            ({"cron": "* * * * *", "time_zone": "Mars/Olympus"}, "schedule.time_zone"),
            ({}, "schedule.cron"),
            # SubmitMessages' own `model` check, under the schedule's input
            ({"cron": "0 9 * * *", "model": "nope:x"}, "schedule.input.model"),
            ({"cron": "0 9 * * *", "model": "scripted:nope"}, "schedule.input.model"),
        ]
        for options, field in cases:
            with pytest.raises(TurnwireError) as refused:
                await client.create_schedule("c", "ping", **options)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert field in {name for name, _ in refused.value.field_violations}, refused.value
            assert refused.value.message.startswith(f"{field}: "), refused.value
        assert (await client.list_schedules()).schedules == []  # nothing stored
        await client.create_schedule("c", "ping", cron="0 9 * * *", schedule_id="dup")
        with pytest.raises(TurnwireError) as taken:
            await client.create_schedule("c", "ping", cron="0 9 * * *", schedule_id="dup")
        assert (taken.value.code, taken.value.reason) == (grpc.StatusCode.ALREADY_EXISTS, "SCHEDULE_EXISTS")


async def test_a_tenant_sees_only_its_own_schedules(sidecar_factory: SidecarFactory, tmp_path: Path) -> None:
    tokens = write_tokens_file(tmp_path / "tokens.json", {TOKEN_A: ("alice", "a"), TOKEN_B: ("bob", "b")})
    sidecar = await sidecar_factory({**CONFIG, "auth": auth_config(tokens)}).start()
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_A) as a,
        TurnwireClient(sidecar.target, token=TOKEN_B) as b,
    ):
        mine = await a.create_schedule("c", "ping", cron="0 9 * * *", schedule_id="nightly")
        assert (mine.schedule_id, mine.input.conversation_id) == ("nightly", "c")  # no tenant prefix
        with pytest.raises(TurnwireError) as theirs:
            await b.get_schedule("nightly")
        with pytest.raises(TurnwireError) as nobodys:
            await b.get_schedule("no-such")
        assert theirs.value.code == nobodys.value.code == grpc.StatusCode.NOT_FOUND
        assert str(theirs.value).replace("nightly", "no-such") == str(nobodys.value)
        assert list((await b.list_schedules()).schedules) == []
        ours = await b.create_schedule(
            "c", "ping", cron="0 9 * * *", schedule_id="nightly"
        )  # the same id: B's own
        assert ours.schedule_id == "nightly"
        assert [s.schedule_id for s in (await a.list_schedules()).schedules] == ["nightly"]


async def test_the_cli_creates_lists_pauses_and_deletes(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    target = ["--target", sidecar.target]
    created = await run_turnwire(
        "schedule",
        "create",
        "c",
        "ping",
        "--cron",
        "0 9 * * MON-FRI",
        "--time-zone",
        "Europe/Paris",
        "--schedule-id",
        "weekdays",
        *target,
    )
    assert created.code == 0, created.stderr
    assert created.stdout.startswith("weekdays · active · cron '0 9 * * MON-FRI' Europe/Paris · next ")
    paused = await run_turnwire("schedule", "pause", "weekdays", *target)
    assert "· paused ·" in paused.stdout
    refused = await run_turnwire("schedule", "create", "c", "ping", "--cron", "nope", *target)
    assert refused.code == 2 and "schedule.cron" in refused.stderr
    deleted = await run_turnwire("schedule", "delete", "weekdays", *target)
    assert (deleted.code, deleted.stdout.strip()) == (0, "deleted")
