"""Webhooks end to end, on real sidecar processes and a receiver on loopback (docs/webhooks.md;
issue 41): the call signed per the Standard Webhooks specification and verified with its
library; completion, failure and cancellation; a loopback target not allowed is refused (every
non-public address is, by default); a receiver answering 500 twice then 200 gets three calls with
one id; a SIGKILL between the turn's end and the delivery still delivers after the restart, also
by another PostgreSQL replica; a schedule's fires call the target of its input when they complete,
fail or are cancelled, and a schedule naming a target the server refuses is not created."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from standardwebhooks import Webhook
from support.endless import endless_step
from support.sidecar import SidecarFactory, run_turnwire
from support.stores import postgres_database
from support.waiting import wait_until
from support.webhook_receiver import WebhookReceiver, new_secret, webhook_receiver

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import chat_service_pb2, webhook_pb2

SECRET_ENV = "TURNWIRE_TEST_WEBHOOK_SECRET"
DELIVERED = webhook_pb2.WEBHOOK_DELIVERY_STATE_DELIVERED
FAILED = webhook_pb2.WEBHOOK_DELIVERY_STATE_FAILED


def config(url: str, **webhooks: Any) -> dict[str, Any]:
    """Endpoint ``app`` at ``url`` (on 127.0.0.1, which ``allowed_networks`` allows) and ``inside``
    on 127.0.0.2: loopback too, but not allowed, as every non-public address is by default."""
    return {
        "default_model": "scripted:echo",
        "providers": {
            "scripted": {
                "scripts": {
                    "echo": [{"text": "answered"}],
                    "broken": [{"error": {"message": "the model is down", "status": 400, "after_chunks": 0}}],
                    "endless": [endless_step("w ", 50)],
                }
            }
        },
        "webhooks": {
            "endpoints": {
                "app": {"url": url, "secret_env": SECRET_ENV},
                "inside": {"url": "http://127.0.0.2:8080/hook", "secret_env": SECRET_ENV},
            },
            "allowed_networks": ["127.0.0.1/32"],
            "allow_request_urls": True,
            "secret_env": SECRET_ENV,
            # Fast retries and polls, so the test waits little.
            "initial_backoff_seconds": 0.2,
            "poll_interval_seconds": 0.2,
            "timeout_seconds": 2,
            **webhooks,
        },
    }


async def deliveries(client: TurnwireClient, submission_id: str) -> list[webhook_pb2.WebhookDelivery]:
    return list((await client.list_webhook_deliveries(submission_id=submission_id)).deliveries)


async def ended(client: TurnwireClient, submission_id: str) -> webhook_pb2.WebhookDelivery:
    """The submission's one delivery, once delivered or failed."""

    async def done() -> list[webhook_pb2.WebhookDelivery]:
        found = await deliveries(client, submission_id)
        return found if found and found[0].state in (DELIVERED, FAILED) else []

    (delivery,) = await wait_until(done, what=f"the webhook delivery of {submission_id} ends")
    return delivery


def verified(receiver: WebhookReceiver, secret: str, index: int) -> dict[str, Any]:
    call = receiver.calls[index]
    payload: dict[str, Any] = Webhook(secret).verify(call.body, call.headers)
    return payload


async def test_calls_are_signed_on_every_end_and_non_public_targets_are_refused(
    sidecar_factory: SidecarFactory,
) -> None:
    secret = new_secret()
    async with webhook_receiver() as receiver:
        sidecar = await sidecar_factory(config(receiver.url), env={SECRET_ENV: secret}).start()
        async with TurnwireClient(sidecar.target) as client:
            done = await client.submit_messages("wh", "hello", submission_id="s-done", webhook="app")
            assert done.submission.webhook.endpoint == "app"
            await ended(client, "s-done")
            await client.submit_messages(
                "wh", "fail", submission_id="s-fail", model="scripted:broken", webhook="app"
            )
            await ended(client, "s-fail")
            await client.submit_messages(
                "wh-2", "go", submission_id="s-cancel", model="scripted:endless", webhook="app"
            )
            await client.cancel_submission("s-cancel")
            cancelled = await ended(client, "s-cancel")
            await client.submit_messages("wh", "quiet", submission_id="s-none")  # no target: no call

            payloads = [verified(receiver, secret, i) for i in range(len(receiver.calls))]
            by_submission = {p["data"]["submission_id"]: p for p in payloads}
            assert set(by_submission) == {"s-done", "s-fail", "s-cancel"}
            assert by_submission["s-done"]["type"] == "turn.completed"
            assert by_submission["s-done"]["data"] == {
                "submission_id": "s-done",
                "conversation_id": "wh",
                "state": "completed",
            }
            assert by_submission["s-fail"]["type"] == "turn.failed"
            assert "the model is down" in by_submission["s-fail"]["data"]["error"]["message"]
            assert by_submission["s-cancel"]["type"] == "turn.cancelled"
            assert by_submission["s-cancel"]["data"]["state"] == "aborted"
            # The id is the delivery's, listed with its attempt.
            ids = {
                json.loads(c.body)["data"]["submission_id"]: c.headers["webhook-id"] for c in receiver.calls
            }
            assert ids["s-cancel"] == cancelled.delivery_id
            assert [(a.attempt, a.http_status) for a in cancelled.attempts] == [(1, 200)]
            assert cancelled.event_type == "turn.cancelled" and cancelled.target.endpoint == "app"
            # A signature made with another secret does not verify.
            with pytest.raises(Exception, match="signature"):
                Webhook(new_secret()).verify(receiver.calls[0].body, receiver.calls[0].headers)

            # A loopback address not allowed is refused, at once and without a call.
            await client.submit_messages("ssrf", "hello", submission_id="s-inside", webhook="inside")
            refused_delivery = await ended(client, "s-inside")
            assert refused_delivery.state == FAILED  # refused: no retry
            (attempt,) = refused_delivery.attempts
            assert attempt.http_status == 0 and "loopback" in attempt.error
            assert len(receiver.calls) == len(payloads)
            # A per-request URL naming a non-public address is refused when submitted; so is an
            # unknown endpoint.
            for target, field in (
                ({"url": "http://10.1.2.3/hook"}, "webhook.url"),
                ({"url": "http://[::1]:8080/hook"}, "webhook.url"),
                ({"url": "http://2130706433/hook"}, "webhook.url"),  # never callable: no dotted quad
                ({"url": "http://0x7f000001/hook"}, "webhook.url"),  # the resolver's hex form
                ("nope", "webhook.endpoint"),
            ):
                with pytest.raises(TurnwireError) as refused:
                    await client.submit_messages("ssrf", "again", webhook=target)
                assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
                assert field in str(refused.value)
    assert await sidecar.terminate() == 0, sidecar.log_text()
    assert secret.removeprefix("whsec_") not in sidecar.log_text()


async def test_a_schedule_s_fires_call_its_input_s_webhook(sidecar_factory: SidecarFactory) -> None:
    """docs/schedules.md, "Webhooks": the target of ``Schedule.input`` goes with each fire's
    submission (``tw-<schedule>.<n>``), so its end is called as a submission's is; CreateSchedule
    checks the target as SubmitMessages does, under ``schedule.input.webhook``."""
    secret = new_secret()
    async with webhook_receiver() as receiver:
        cfg = {**config(receiver.url), "schedules": {"poll_interval_seconds": 0.2}}
        sidecar = await sidecar_factory(cfg, env={SECRET_ENV: secret}).start()
        async with TurnwireClient(sidecar.target) as client:
            # Three single-time schedules a second ahead, one per way a run ends; each on its own
            # conversation, so none waits behind another.
            at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
            runs = {"done": "scripted:echo", "fail": "scripted:broken", "cancel": "scripted:endless"}
            for name, model in runs.items():
                created = await client.create_schedule(
                    f"sw-{name}", "hello", fire_time=at, model=model, schedule_id=f"sw-{name}", webhook="app"
                )
                assert created.input.webhook.endpoint == "app"

            async def fired(submission_id: str) -> bool:
                page = await client.list_submissions(page_size=100)
                return any(s.submission_id == submission_id for s in page.submissions)

            await wait_until(lambda: fired("tw-sw-cancel.1"), what="the endless schedule fires")
            await client.cancel_submission("tw-sw-cancel.1")
            ends = {name: await ended(client, f"tw-sw-{name}.1") for name in runs}
            assert {name: d.state for name, d in ends.items()} == dict.fromkeys(runs, DELIVERED)
            assert (await client.get_submission("tw-sw-done.1")).webhook.endpoint == "app"

            payloads = {
                p["data"]["submission_id"]: p
                for p in (verified(receiver, secret, i) for i in range(len(receiver.calls)))
            }
            assert payloads["tw-sw-done.1"] == {
                "type": "turn.completed",
                "timestamp": payloads["tw-sw-done.1"]["timestamp"],
                "data": {"submission_id": "tw-sw-done.1", "conversation_id": "sw-done", "state": "completed"},
            }
            assert payloads["tw-sw-fail.1"]["type"] == "turn.failed"
            assert "the model is down" in payloads["tw-sw-fail.1"]["data"]["error"]["message"]
            assert payloads["tw-sw-cancel.1"]["type"] == "turn.cancelled"
            assert {c.headers["webhook-id"] for c in receiver.calls} == {d.delivery_id for d in ends.values()}

            # A target the server refuses is refused at creation, under schedule.input.webhook.
            for target, field in (
                ("nope", "schedule.input.webhook.endpoint"),
                ({"url": "http://10.1.2.3/hook"}, "schedule.input.webhook.url"),
            ):
                with pytest.raises(TurnwireError) as refused:
                    await client.create_schedule("sw", "hello", cron="0 9 * * *", webhook=target)
                assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
                assert field in {name for name, _ in refused.value.field_violations}, refused.value
        # The CLI names the target with --webhook, and shows it.
        made = await run_turnwire(
            "schedule", "create", "sw", "hello", "--cron", "0 9 * * *", "--webhook", "app",
            "--schedule-id", "sw-cli", "--target", sidecar.target,
        )  # fmt: skip
        assert made.code == 0, made.stderr
        assert made.stdout.strip().endswith(" skipped · webhook app"), made.stdout
        async with TurnwireClient(sidecar.target) as client:
            listed = await client.list_schedules()
            assert [s.schedule_id for s in listed.schedules] == ["sw-cancel", "sw-cli", "sw-done", "sw-fail"]
            states = {s.schedule_id: s.state for s in listed.schedules}
            assert states["sw-done"] == chat_service_pb2.SCHEDULE_STATE_COMPLETED
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_500_twice_then_200_makes_three_calls_with_one_id(sidecar_factory: SidecarFactory) -> None:
    secret = new_secret()
    async with webhook_receiver([500, 500, 200]) as receiver:
        sidecar = await sidecar_factory(config(receiver.url), env={SECRET_ENV: secret}).start()
        async with TurnwireClient(sidecar.target) as client:
            await client.submit_messages("retry", "hello", submission_id="s-retry", webhook="app")
            delivery = await ended(client, "s-retry")
            assert delivery.state == DELIVERED
            assert [(a.attempt, a.http_status, a.error) for a in delivery.attempts] == [
                (1, 500, "HTTP 500"),
                (2, 500, "HTTP 500"),
                (3, 200, ""),
            ]
            assert len(receiver.calls) == 3
            assert {c.headers["webhook-id"] for c in receiver.calls} == {delivery.delivery_id}
            assert len({c.body for c in receiver.calls}) == 1  # the same payload each time
            for index in range(3):
                verified(receiver, secret, index)
        # The CLI lists the same.
        listed = await run_turnwire(
            "webhooks", "deliveries", "--submission", "s-retry", "--target", sidecar.target
        )
        assert listed.code == 0, listed.stderr
        assert delivery.delivery_id in listed.stdout and "delivered" in listed.stdout
        assert [line.split(" · ")[2] for line in listed.stdout.splitlines()[1:]] == [
            "HTTP 500",
            "HTTP 500",
            "HTTP 200",
        ]
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_sigkill_between_the_end_and_the_delivery_still_delivers(
    sidecar_factory: SidecarFactory,
) -> None:
    secret = new_secret()
    # The first call is held open: the sidecar dies with its attempt unanswered.
    async with webhook_receiver([None]) as receiver:
        first = await sidecar_factory(config(receiver.url), env={SECRET_ENV: secret}).start()
        async with TurnwireClient(first.target) as client:
            await client.submit_messages("crash", "hello", submission_id="s-crash", webhook="app")
            await wait_until(lambda: len(receiver.calls) == 1, what="the first attempt reaches the receiver")
        first.kill()
        receiver.release()

        second = await sidecar_factory(config(receiver.url), env={SECRET_ENV: secret}).start()
        async with TurnwireClient(second.target) as client:
            delivery = await ended(client, "s-crash")
            assert delivery.state == DELIVERED
            # The killed attempt is listed without a result; the next one delivered.
            assert [(a.attempt, a.http_status, a.HasField("duration")) for a in delivery.attempts] == [
                (1, 0, False),
                (2, 200, True),
            ]
            assert [c.headers["webhook-id"] for c in receiver.calls] == [delivery.delivery_id] * 2
            verified(receiver, secret, 1)
    assert await second.terminate() == 0, second.log_text()


async def test_another_replica_delivers_what_a_killed_one_was_calling(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """PostgreSQL replicas: the one that died mid-attempt held the delivery under a lease; once
    it lapses (timeout_seconds + 5 s) the live replica claims it and delivers, same id."""
    secret = new_secret()
    cfg = config("", timeout_seconds=1)
    async with webhook_receiver([None]) as receiver:
        cfg["webhooks"]["endpoints"]["app"]["url"] = receiver.url
        with postgres_database() as url:
            first = await sidecar_factory(
                cfg, env={SECRET_ENV: secret}, workdir=tmp_path / "a", store_url=url
            ).start()
            async with TurnwireClient(first.target) as client:
                await client.submit_messages("pg", "hello", submission_id="s-pg", webhook="app")
                await wait_until(
                    lambda: len(receiver.calls) == 1, what="replica a's attempt reaches the receiver"
                )
            second = await sidecar_factory(
                cfg, env={SECRET_ENV: secret}, workdir=tmp_path / "b", store_url=url
            ).start()
            first.kill()
            async with TurnwireClient(second.target) as client:
                delivery = await ended(client, "s-pg")
                assert delivery.state == DELIVERED
                assert [(a.attempt, a.http_status) for a in delivery.attempts] == [(1, 0), (2, 200)]
                assert [c.headers["webhook-id"] for c in receiver.calls] == [delivery.delivery_id] * 2
            assert await second.terminate() == 0, second.log_text()
