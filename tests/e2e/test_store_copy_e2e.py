"""``turnwire migrate --from sqlite:///… --to postgresql://…``: a sidecar's SQLite store copied
into PostgreSQL and served from there, every message, submission, stored stream, schedule and
webhook delivery identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.sidecar import SidecarFactory, run_turnwire
from support.stores import postgres_database
from support.waiting import wait_until
from support.webhook_receiver import new_secret, webhook_receiver

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import webhook_pb2

SECRET_ENV = "TURNWIRE_TEST_WEBHOOK_SECRET"


def config(webhook_url: str) -> dict[str, Any]:
    return {
        "providers": {"scripted": {"scripts": {"short": [{"text": "one two three"}]}}},
        "webhooks": {
            "endpoints": {"app": {"url": webhook_url, "secret_env": SECRET_ENV}},
            "allowed_networks": ["127.0.0.1/32"],
            "poll_interval_seconds": 0.2,
        },
    }


async def _snapshot(target: str) -> tuple[list[bytes], ...]:
    async with TurnwireClient(target) as client:
        conversations = [await client.get_conversation(c) for c in ("a", "b", "a-fork")]
        submission = await client.get_submission("s-1")
        events = [e async for e in client.resume_turn("r-a")]
        schedule = await client.get_schedule("daily")
        deliveries = await client.list_webhook_deliveries(submission_id="s-1")
    return (
        [c.SerializeToString(deterministic=True) for c in conversations],
        [submission.SerializeToString(deterministic=True)],
        [e.SerializeToString(deterministic=True) for e in events],
        [schedule.SerializeToString(deterministic=True), deliveries.SerializeToString(deterministic=True)],
    )


async def test_an_sqlite_store_copied_to_postgres_serves_the_same_data(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    env = {SECRET_ENV: new_secret()}
    async with webhook_receiver() as receiver:
        first = await sidecar_factory(config(receiver.url), workdir=tmp_path / "sqlite", env=env).start()
        async with TurnwireClient(first.target) as client:
            assert (await collect(client.chat("a", "What is 6 * 7?", request_id="r-a"))).ok
            assert (await collect(client.chat("b", "hello", model="scripted:short"))).ok
            await client.submit_messages(
                "b", "and then?", submission_id="s-1", model="scripted:short", webhook="app"
            )
            assert [e async for e in client.watch_submission("s-1")][-1].HasField("turn_end")

            async def delivered() -> bool:
                found = (await client.list_webhook_deliveries(submission_id="s-1")).deliveries
                return bool(found) and found[0].state == webhook_pb2.WEBHOOK_DELIVERY_STATE_DELIVERED

            await wait_until(delivered, what="the webhook delivery of s-1 is delivered")
    async with TurnwireClient(first.target) as client:
        await client.create_schedule("b", "Daily summary", cron="0 9 * * *", schedule_id="daily")
        # A fork (docs/forks.md): it reads a's rows, so its sharing is copied too.
        first_message = (await client.get_conversation("a")).messages[0].id
        await client.fork_conversation("a", first_message, new_conversation_id="a-fork")
    before = await _snapshot(first.target)
    assert await first.terminate() == 0, first.log_text()

    with postgres_database() as url:
        missing = tmp_path / "missing.db"
        status, out, err = await run_turnwire("migrate", "--from", f"sqlite:///{missing}", "--to", url)
        assert status == 1 and "no SQLite store at" in err and not missing.exists(), "a typo creates nothing"
        status, out, err = await run_turnwire("migrate", "--from", first.store_url, "--to", url)
        assert status == 0, err
        assert "copied 3 conversations" in out and "copied 1 submissions" in out
        assert "copied 1 schedules" in out and "copied 1 webhook_deliveries" in out
        assert "copied 1 webhook_attempts" in out
        status, out, err = await run_turnwire("migrate", "--from", first.store_url, "--to", url)
        assert status == 1 and "already holds conversations" in err, "never into a used store"

        second = await sidecar_factory(
            config("http://127.0.0.1:9/unused"), workdir=tmp_path / "postgres", store_url=url, env=env
        ).start()
        assert await _snapshot(second.target) == before
        async with TurnwireClient(second.target) as client:
            assert (await collect(client.chat("a", "And 12 * 7?"))).ok, "it goes on from there"
        assert await second.terminate() == 0, second.log_text()
