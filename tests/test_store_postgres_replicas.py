"""What PostgreSQL replicas see of each other's writes in the same transaction (its dialect's
statements, ``store/postgres/db.py``): work a survivor claims keeps its place in the turn queue
under the new owner, and events one replica stores wake a reader following the turn on another
(docs/semantics.md §5, "Leases").

Two stores on one database stand for two replicas.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator

import pytest
from support.stores import StoreBackend, leased_turn, postgres_database
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store import TurnRecord
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.errors import TurnAlreadyExists
from turnwire_server.store.postgres import PostgresStore
from turnwire_server.store.records import StreamRecord, SubmissionRecord

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
LEASE = T0 + dt.timedelta(seconds=30)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database of its own on the test server (dropped afterwards)."""
    with postgres_database() as url:
        yield url


@pytest.fixture
async def replicas(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two open stores on one database, closed at teardown."""
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    await first.open()
    await second.open()
    yield first, second
    await first.close()
    await second.close()


def _user(message_id: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = message_id
    return message


def _turn(request_id: str, conversation_id: str, owner: str) -> TurnRecord:
    return leased_turn(request_id, conversation_id, owner, start_time=T0)


def _pending(
    submission_id: str, conversation_id: str, owner: str, created: dt.datetime, lease_until: dt.datetime
) -> SubmissionRecord:
    """A submission ``owner`` accepted and holds the lease of until ``lease_until``."""
    return SubmissionRecord(
        submission_id=submission_id,
        conversation_id=conversation_id,
        idempotency_key="",
        state="pending",
        request=b"request",
        create_time=created,
        owner=owner,
        lease_until=lease_until,
    )


async def test_claimed_turns_and_submissions_keep_their_queue_tickets_under_the_claimant(
    replicas: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    dead, survivor = replicas
    # The dead replica held c1's turn lock for r1 (a ticket it never released) and had accepted s1.
    await dead.reserve_place("c1", "r1", owner="dead", lease_seconds=30)
    await dead.start_turn(_turn("r1", "c1", "dead"), [_user("u1")])
    await dead.create_submission(_pending("s1", "c2", "dead", T0, LEASE), max_open=10)
    later = LEASE + dt.timedelta(seconds=1)
    until = later + dt.timedelta(seconds=30)

    turns = await survivor.claim_interrupted_turns("survivor", later, until, 10)
    submissions = await survivor.claim_pending_submissions("survivor", later, until, 10)

    assert [t.request_id for t in turns] == ["r1"] and [s.submission_id for s in submissions] == ["s1"]
    tickets = StoreBackend("postgres", url=pg_url).sql(
        "SELECT request_id, owner, lease_until FROM turn_queue ORDER BY request_id"
    )
    assert tickets == [("r1", "survivor", to_us(until, "until")), ("s1", "survivor", to_us(until, "until"))]


async def test_events_one_replica_stores_wake_a_reader_following_on_another(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    runner, follower = replicas
    await runner.start_turn(_turn("r1", "c1", "runner"), [_user("u1")])
    await wait_until(follower._listener.connected.is_set, what="the follower's listener is connected")
    # The follower waits once it has seen no stream yet; a store that never woke it would keep
    # it waiting for the whole (long) timeout.
    looked = asyncio.Event()
    get_stream = follower.get_stream

    async def spy(request_id: str) -> StreamRecord | None:
        stream = await get_stream(request_id)
        looked.set()
        return stream

    follower.get_stream = spy  # type: ignore[method-assign]
    following = asyncio.create_task(follower.wait_for_events("r1", 0, timeout_seconds=600))
    await asyncio.wait_for(looked.wait(), timeout=30)
    assert not following.done()

    await runner.append_events("c1", "r1", [(1, b"event")], ended=False)

    assert await wait_until(following.done, what="the follower was woken") is True
    assert following.result() is True


async def test_a_waiter_whose_ticket_lapsed_queues_again_instead_of_waiting_for_good(
    replicas: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """B waits in line behind A; B's ticket is deleted as lapsed (B was paused past its lease
    and a claim or another waiter's look removed it). Once A is done, B takes a ticket again and
    gets the lock, instead of waiting until its deadline for a number that is gone (chaos probe:
    a Chat call stalled 45 s after its replica's SIGSTOP)."""
    first, second = replicas
    backend = StoreBackend("postgres", url=pg_url)
    held = asyncio.Event()

    async def b_waits() -> None:
        async with second.turn_lock("conv-q", request_id="r-b", owner="replica-b", lease_seconds=6.0):
            held.set()

    try:
        async with first.turn_lock("conv-q", request_id="r-a", owner="replica-a", lease_seconds=6.0):
            waiter = asyncio.ensure_future(b_waits())
            await wait_until(
                lambda: backend.sql("SELECT count(*) FROM turn_queue WHERE owner = 'replica-b'") == [(1,)],
                what="B's ticket behind A's",
            )
            backend.sql("DELETE FROM turn_queue WHERE owner = 'replica-b'")  # lapsed, removed
        await asyncio.wait_for(waiter, 10)
        assert held.is_set()
        assert backend.sql("SELECT count(*) FROM turn_queue") == [(0,)], "B's new ticket released"
    finally:
        await backend.close()


async def test_a_paused_waiter_whose_ticket_was_taken_over_is_refused_at_its_start(
    replicas: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """B accepted submission s1 and waits in line for it behind A's turn; B is paused past its
    lease and C claims s1, whose ticket becomes C's and keeps its place (``take_over_tickets``).
    When A is done, the waiters compare the head with their ticket's number, not its owner, so
    both B's and C's turn locks get it: a ticket is re-owned only with its own request id, so
    both hold it for s1, and the store's start of s1's turn lets one run it. C starts it; B's start
    is refused (the turn's row exists), nothing of B's is stored, and B's release leaves C's
    ticket to C (docs/semantics.md §5, "Leases")."""
    abc, b = replicas  # A and C are two owners on one store: the store keeps no owner of its own
    backend = StoreBackend("postgres", url=pg_url)
    now = dt.datetime.now(dt.UTC)
    b_looked, c_started, b_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    outcome: dict[str, object] = {}
    head = b._head

    async def b_head(conversation_id: str, lease_us: int) -> int | None:
        found = await head(conversation_id, lease_us)
        b_looked.set()
        return found

    b._head = b_head  # type: ignore[method-assign]

    async def b_runs() -> None:
        try:
            async with b.turn_lock("conv-q", request_id="s1", owner="replica-b", lease_seconds=30.0):
                await c_started.wait()
                await b.start_turn(leased_turn("s1", "conv-q", "replica-b", start_time=now), [_user("u-b")])
        except Exception as error:  # its start refused (or, were owners compared, its lock)
            outcome["b"] = error
        finally:
            b_done.set()

    async def c_runs() -> None:
        async with abc.turn_lock("conv-q", request_id="s1", owner="replica-c", lease_seconds=30.0):
            await abc.start_turn(leased_turn("s1", "conv-q", "replica-c", start_time=now), [_user("u-c")])
            c_started.set()
            await b_done.wait()  # B is done meanwhile
            outcome["tickets under C"] = backend.sql("SELECT owner FROM turn_queue")

    try:
        async with abc.turn_lock("conv-q", request_id="r-a", owner="replica-a", lease_seconds=30.0):
            accepted = _pending("s1", "conv-q", "replica-b", now, now + dt.timedelta(seconds=30))
            await b.create_submission(accepted, max_open=10)
            waiting_b = asyncio.ensure_future(b_runs())
            await asyncio.wait_for(b_looked.wait(), 10)  # B holds its ticket number and waits
            lapsed = now + dt.timedelta(seconds=31)
            claimed = await abc.claim_pending_submissions(
                "replica-c", lapsed, lapsed + dt.timedelta(seconds=30), 10
            )
            assert [s.submission_id for s in claimed] == ["s1"]
            assert backend.sql("SELECT request_id, owner FROM turn_queue ORDER BY ticket") == [
                ("r-a", "replica-a"),
                ("s1", "replica-c"),
            ]
            waiting_c = asyncio.ensure_future(c_runs())
        await asyncio.wait_for(asyncio.gather(waiting_b, waiting_c), 20)
        assert isinstance(outcome.get("b"), TurnAlreadyExists), outcome  # B's lock held its number
        assert outcome["tickets under C"] == [("replica-c",)], "B's release left C's ticket alone"
        assert backend.sql("SELECT count(*) FROM turn_queue") == [(0,)]
        stored = await abc.load_messages("conv-q")
        assert [m.id for m in stored] == ["u-c"], "nothing of B's start stored"
    finally:
        await backend.close()
