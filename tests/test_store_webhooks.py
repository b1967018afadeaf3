"""The webhook outbox in the store (migration 0013_webhooks; docs/webhooks.md), on SQLite and
PostgreSQL alike: the delivery row written in the transaction that ends a submission, claims
under a lease, every attempt recorded, the tenant-scoped listing, retention and deletion."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from support.store_turns import T0, started_turn
from support.stores import StoreBackend

from turnwire_server.store import InvalidPageToken, Store
from turnwire_server.store.core import message_writes
from turnwire_server.store.core.webhook_writes import delivery_id_of
from turnwire_server.store.postgres.db import DIALECT as POSTGRES
from turnwire_server.store.records import SubmissionRecord, TurnRecord
from turnwire_server.store.sqlite.db import DIALECT as SQLITE
from turnwire_server.store.webhooks import AttemptResult

LATER = T0 + dt.timedelta(days=3650)  # every row is due by then


def _submission(sid: str, conversation: str = "t/c", *, endpoint: str | None = "orders") -> SubmissionRecord:
    return SubmissionRecord(
        submission_id=sid,
        conversation_id=conversation,
        idempotency_key=None,
        state="pending",
        request=sid.encode(),
        create_time=T0,
        webhook_endpoint=endpoint,
    )


async def _all(store: Store, **filters: str) -> list[str]:
    page, _ = await store.list_webhook_deliveries(100, "", **filters)
    return [d.submission_id for d in page]


async def test_every_way_a_submission_ends_writes_one_delivery_with_its_event(store: Store) -> None:
    for sid in ("t/c-r0", "t/cancelled", "t/expired", "t/plain"):
        await store.create_submission(
            _submission(sid, endpoint=None if sid == "t/plain" else "orders"), max_open=10
        )
    # Completed through its turn's end (finish_turn), in the same transaction.
    turn = await started_turn(store, "c", 0, key_prefix="t/")
    await store.finish_turn(dataclasses.replace(turn, state="completed", end_time=T0), None)
    await store.end_submission("t/cancelled", "aborted", b"why", only_from=("pending", "running"))
    await store.expire_submissions(T0 + dt.timedelta(seconds=1), 10, b"expired")
    page, token = await store.list_webhook_deliveries(10, "")
    assert token == ""
    by_submission = {d.submission_id: d for d in page}
    assert set(by_submission) == {"t/c-r0", "t/cancelled", "t/expired"}  # none for the one without a target
    assert by_submission["t/c-r0"].event_type == "turn.completed"
    assert by_submission["t/cancelled"].event_type == "turn.cancelled"
    assert by_submission["t/cancelled"].error == b"why"
    assert by_submission["t/expired"].event_type == "turn.failed"
    assert by_submission["t/c-r0"].delivery_id == delivery_id_of("t/c-r0")
    assert all(d.state == "pending" and d.endpoint == "orders" and d.attempt_count == 0 for d in page)
    # Ending again writes nothing twice.
    await store.end_submission(
        "t/cancelled", "aborted", b"again", only_from=("pending", "running", "aborted")
    )
    assert len(await _all(store)) == 3


def test_a_turns_end_ends_a_submission_only_when_one_of_its_id_runs() -> None:
    """The final write reads, with the turn's fencing token, whether a submission of its id is
    running: a Chat turn's end (none) runs no statement for submissions or their webhooks, a
    submission's turn's end ends it and writes its outbox row (the store-level test above)."""
    turn = TurnRecord(
        request_id="t/r",
        conversation_id="t/c",
        assistant_message_id="t/a",
        continuation=False,
        model="m",
        state="completed",
        start_time=T0,
        end_time=T0,
    )
    finish = message_writes.prepare_finish_turn(turn, None)
    for dialect in (SQLITE, POSTGRES):
        for running in (False, True):
            program = message_writes.finish_turn(finish, dialect, 1)
            reads = next(program)
            assert "FROM submissions" in reads[-1].sql
            writes = program.send([[("", 0, running)]])
            sql = [statement.sql for statement in writes]
            assert any(s.startswith("UPDATE submissions") for s in sql) is running
            assert any("INTO webhook_deliveries" in s for s in sql) is running


async def test_claims_are_leased_and_every_attempt_is_recorded(store_backend: StoreBackend) -> None:
    store = store_backend.new_store()
    await store.open()
    try:
        await store.create_submission(_submission("t/s1"), max_open=10)
        await store.end_submission("t/s1", "completed", None, only_from=("pending",))
        lease = T0 + dt.timedelta(seconds=30)
        (claimed,) = await store.claim_webhook_deliveries(
            "replica-a", LATER, LATER + dt.timedelta(seconds=30), 10
        )
        assert claimed.attempt_count == 1
        # Held: the same owner does not claim it twice while its attempt runs.
        assert await store.claim_webhook_deliveries("replica-a", LATER, lease, 10) == []
        retry_at = LATER + dt.timedelta(seconds=5)
        failed = AttemptResult("pending", 1500, 500, "HTTP 500", retry_at)
        assert await store.finish_webhook_attempt(claimed.delivery_id, "replica-a", 1, failed, LATER)
        assert await store.claim_webhook_deliveries("replica-a", LATER, lease, 10) == []  # not due yet
        (second,) = await store.claim_webhook_deliveries(
            "replica-a", retry_at, retry_at + dt.timedelta(seconds=30), 10
        )
        assert second.attempt_count == 2
        # A stale owner's result moves nothing (another replica took the delivery over).
        late = AttemptResult("delivered", 10, 200)
        assert not await store.finish_webhook_attempt(second.delivery_id, "replica-a", 1, late, retry_at)
        done = AttemptResult("delivered", 2000, 204)
        assert await store.finish_webhook_attempt(second.delivery_id, "replica-a", 2, done, retry_at)
        (listed,) = (await store.list_webhook_deliveries(10, ""))[0]
        assert listed.state == "delivered" and listed.end_time == retry_at
        assert [(a.attempt, a.http_status, a.error, a.duration_us) for a in listed.attempts] == [
            (1, 500, "HTTP 500", 1500),
            (2, 204, None, 2000),
        ]
    finally:
        await store.close()


async def test_a_lapsed_lease_is_claimed_by_another_replica(
    store: Store, store_backend: StoreBackend
) -> None:
    await store.create_submission(_submission("t/s1"), max_open=10)
    await store.end_submission("t/s1", "error", b"boom", only_from=("pending",))
    until = LATER + dt.timedelta(seconds=10)
    (first,) = await store.claim_webhook_deliveries("replica-a", LATER, until, 10)
    if store_backend.name == "postgres":  # several replicas: a live lease is respected
        assert await store.claim_webhook_deliveries("replica-b", LATER, until, 10) == []
    after = until + dt.timedelta(seconds=1)
    (taken,) = await store.claim_webhook_deliveries("replica-b", after, after + dt.timedelta(seconds=10), 10)
    assert taken.delivery_id == first.delivery_id and taken.attempt_count == 2
    (listed,) = (await store.list_webhook_deliveries(10, ""))[0]
    # The dead replica's attempt is listed, without a result.
    assert [(a.attempt, a.duration_us) for a in listed.attempts] == [(1, None), (2, None)]


async def test_the_listing_is_tenant_scoped_filtered_and_paged(store: Store) -> None:
    for n in range(5):
        await store.create_submission(_submission(f"t/s{n}", conversation=f"t/c{n % 2}"), max_open=10)
        await store.end_submission(f"t/s{n}", "completed", None, only_from=("pending",))
    await store.create_submission(_submission("u/s9", conversation="u/c0"), max_open=10)
    await store.end_submission("u/s9", "completed", None, only_from=("pending",))
    seen: list[str] = []
    token = ""
    while True:
        page, token = await store.list_webhook_deliveries(2, token, id_prefix="t/")
        seen.extend(d.submission_id for d in page)
        if not token:
            break
    assert sorted(seen) == [f"t/s{n}" for n in range(5)] and len(seen) == 5
    assert await _all(store, id_prefix="u/") == ["u/s9"]
    assert sorted(await _all(store, conversation_id="t/c1", id_prefix="t/")) == ["t/s1", "t/s3"]
    assert await _all(store, submission_id="t/s4", id_prefix="t/") == ["t/s4"]
    assert await _all(store, state="delivered") == []
    _, first_token = await store.list_webhook_deliveries(2, "", id_prefix="t/")
    with pytest.raises(InvalidPageToken):  # another tenant's scope
        await store.list_webhook_deliveries(2, first_token, id_prefix="u/")


async def test_retention_and_conversation_deletion_remove_deliveries(store: Store) -> None:
    for sid, conversation in (("t/a", "t/c1"), ("t/b", "t/c2")):
        await store.create_submission(_submission(sid, conversation=conversation), max_open=10)
        await store.end_submission(sid, "completed", None, only_from=("pending",))
    (claimed,) = await store.claim_webhook_deliveries("r", LATER, LATER + dt.timedelta(seconds=9), 1)
    await store.finish_webhook_attempt(claimed.delivery_id, "r", 1, AttemptResult("delivered", 1, 200), LATER)
    assert await store.delete_webhook_deliveries(LATER, 10) == 0  # ended at LATER, not before
    assert await store.delete_webhook_deliveries(LATER + dt.timedelta(seconds=1), 10) == 1
    assert await _all(store) == ["t/b" if claimed.submission_id == "t/a" else "t/a"]
    remaining = (await _all(store))[0]
    await store.delete_conversation("t/c1" if remaining == "t/a" else "t/c2")
    assert await _all(store) == []
