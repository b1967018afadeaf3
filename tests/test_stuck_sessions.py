"""A replica stopped inside a write keeps no turn from being taken over (issue 34; PostgreSQL;
``turnwire_server.store.postgres.stuck_sessions``).

A replica paused or cut off between a fenced write's read batch and its writes leaves its
session inside the transaction with the turn's row locked; PostgreSQL ends no such session by
itself. These tests hold such a transaction open on a session named for replica A (exactly what
the server sees of a frozen A) and check that replica B's claims end it once A's lease lapsed
and the transaction is older than a lease, and then take the turn over; and that nothing else
is ended: a replica whose lease is live, a young transaction, a session of no replica.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from support.stores import leased_turn, postgres_database
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store import TurnRecord
from turnwire_server.store.postgres import PostgresStore
from turnwire_server.store.postgres.stuck_sessions import session_name

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
LAPSED = T0 + dt.timedelta(seconds=31)  # A's lease (30 s from T0) has lapsed by then
LEASE = dt.timedelta(seconds=0.3)  # the claimant's lease: transactions older than this are stuck


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
async def replica_b(pg_url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_url, replica_id="replica-b")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def _running_turn(
    store: PostgresStore, request_id: str, owner: str = "replica-a", *, lease_seconds: float = 30
) -> TurnRecord:
    turn = leased_turn(request_id, "c-" + request_id, owner, start_time=T0, lease_seconds=lease_seconds)
    question = message_pb2.Message(id="u-" + request_id, role=message_pb2.ROLE_USER)
    question.parts.add().text.text = "question"
    await store.start_turn(turn, [question])
    return turn


async def _frozen_inside_a_write(url: str, request_id: str, application_name: str) -> psycopg.AsyncConnection:
    """A session that locked turn ``request_id``'s row, as a fenced write's read batch does, and
    then waits for its client forever."""
    conn = await psycopg.AsyncConnection.connect(url, application_name=application_name)
    await conn.execute("BEGIN")
    await conn.execute("SELECT owner, lease_epoch FROM turns WHERE request_id = %s FOR UPDATE", (request_id,))
    return conn


async def _claims(store: PostgresStore) -> list[str]:
    claimed = await store.claim_interrupted_turns("replica-b", LAPSED, LAPSED + LEASE, 10)
    return [turn.request_id for turn in claimed]


async def _is_dead(conn: psycopg.AsyncConnection) -> bool:
    try:
        await conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False


async def test_a_claim_ends_the_stuck_session_of_a_lapsed_replica_then_takes_its_turn(
    pg_url: str, replica_b: PostgresStore
) -> None:
    await _running_turn(replica_b, "r1")
    frozen = await _frozen_inside_a_write(pg_url, "r1", session_name("replica-a"))
    claimed: list[str] = []

    async def taken_over() -> bool:
        claimed.extend(await _claims(replica_b))
        return bool(claimed)

    # Without ending A's session, its row lock keeps every claim off the turn for good.
    await wait_until(taken_over, timeout=20, what="B takes over the turn A's stuck session locked")
    assert claimed == ["r1"]
    assert await _is_dead(frozen), "A's stuck session was ended"
    await frozen.close()


async def test_sessions_of_a_live_replica_young_transactions_and_other_clients_are_left_alone(
    pg_url: str, replica_b: PostgresStore
) -> None:
    # A's lease on r2 is live at LAPSED (it runs until T0 + 60 s): A is not stuck, only slow.
    await _running_turn(replica_b, "r2", lease_seconds=60)
    live = await _frozen_inside_a_write(pg_url, "r2", session_name("replica-a"))
    # A session of no replica holding the row of replica C's lapsed turn (an operator's psql).
    await _running_turn(replica_b, "r3", "replica-c")
    foreign = await _frozen_inside_a_write(pg_url, "r3", "psql")
    try:
        for _ in range(3):  # transactions long past the claimant's lease by the last claim
            assert await _claims(replica_b) == []
            await foreign.execute("SELECT pg_sleep(0.2)")  # what ages the transactions
        assert not await _is_dead(live)
        assert not await _is_dead(foreign)
    finally:
        await live.close()
        await foreign.close()


async def test_a_transaction_younger_than_a_lease_is_not_stuck(pg_url: str, replica_b: PostgresStore) -> None:
    await _running_turn(replica_b, "r4")
    young = await _frozen_inside_a_write(pg_url, "r4", session_name("replica-a"))
    try:
        hour_lease = LAPSED + dt.timedelta(hours=1)  # the transaction is far younger than that
        claimed = await replica_b.claim_interrupted_turns("replica-b", LAPSED, hour_lease, 10)
        assert claimed == []
        assert not await _is_dead(young)
    finally:
        await young.close()


def test_a_replica_id_too_long_for_a_session_name_is_refused() -> None:
    assert session_name("replica-0123456789ab") == "turnwire/replica-0123456789ab"
    with pytest.raises(ValueError, match="too long"):
        PostgresStore("postgresql://u@127.0.0.1/db", replica_id="x" * 55)


async def test_a_turn_is_not_claimed_while_its_replica_is_inside_a_younger_transaction(
    pg_url: str, replica_b: PostgresStore
) -> None:
    """A paused inside a write of the turn's conversation (its row locked as an insert's foreign
    key locks it), not of the turn's row. Claimed at once, the turn's recovery would wait on that
    lock, and its claimant's lease loop with it, for as long as A is paused; so the claims pass it
    over while A's transaction is younger than a lease, end A's session once it is older, and
    then take the turn, whose conversation is free again."""
    await _running_turn(replica_b, "r5")
    frozen = await psycopg.AsyncConnection.connect(pg_url, application_name=session_name("replica-a"))
    await frozen.execute("BEGIN")
    await frozen.execute("SELECT 1 FROM conversations WHERE id = 'c-r5' FOR KEY SHARE")
    hour_lease = LAPSED + dt.timedelta(hours=1)  # the transaction is far younger than that
    assert await replica_b.claim_interrupted_turns("replica-b", LAPSED, hour_lease, 10) == []
    assert not await _is_dead(frozen), "young: not ended"
    claimed: list[str] = []
    two_seconds = LAPSED + dt.timedelta(seconds=2)  # A lapsed a second ago: within that lease

    async def taken_over() -> bool:
        turns = await replica_b.claim_interrupted_turns("replica-b", LAPSED, two_seconds, 10)
        claimed.extend(turn.request_id for turn in turns)
        return bool(claimed)

    await wait_until(taken_over, timeout=20, what="B takes the turn once A's session is ended")
    assert claimed == ["r5"]
    assert await _is_dead(frozen), "A's stuck session was ended first"
    await frozen.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what B's recovery writes first
        conn.execute("SET lock_timeout = '5s'")
        conn.execute("SELECT 1 FROM conversations WHERE id = 'c-r5' FOR UPDATE")


async def test_a_lapsed_replica_still_writing_is_passed_over_for_a_lease_only(
    pg_url: str, replica_b: PostgresStore
) -> None:
    """A replica whose leases lapsed but which keeps opening short transactions (alive, its lease
    loop stalled) never has one old enough to end: its turns are passed over only within a lease
    of its lapse, then taken over as before."""
    await _running_turn(replica_b, "r6")  # A's lease ran until T0 + 30 s; LAPSED is a second later
    writing = await psycopg.AsyncConnection.connect(pg_url, application_name=session_name("replica-a"))
    await writing.execute("BEGIN")  # a young transaction of A at every claim below
    try:
        within = await replica_b.claim_interrupted_turns(
            "replica-b", LAPSED, LAPSED + dt.timedelta(hours=1), 10
        )  # a lease of an hour: A lapsed within it
        assert within == [], "passed over within a lease of A's lapse"
        assert await _claims(replica_b) == ["r6"], "taken over after it (a lease of 0.3 s, lapsed 1 s ago)"
        assert not await _is_dead(writing), "a young transaction is not ended"
    finally:
        await writing.close()


async def test_a_session_waiting_on_its_client_that_blocks_this_replica_is_ended(
    pg_url: str, replica_b: PostgresStore
) -> None:
    """A replica paused again after its turn was taken over, inside a stale write that locked the
    turn's row: it owns no lapsed turn, but it blocks this replica (here its renewal of that
    turn). Waiting on its client for longer than a lease while this replica waits on it, its
    session is ended by the next claim."""
    await _running_turn(replica_b, "r7", owner="replica-b", lease_seconds=3600)
    frozen = await _frozen_inside_a_write(pg_url, "r7", session_name("replica-a"))
    renewing = await psycopg.AsyncConnection.connect(
        pg_url, application_name=session_name("replica-b"), autocommit=True
    )
    renewal = asyncio.ensure_future(
        renewing.execute("UPDATE turns SET lease_until = lease_until + 1 WHERE request_id = 'r7'")
    )
    pid = frozen.info.backend_pid
    try:

        async def ended() -> bool:  # asked from elsewhere: a statement on A's session would wake it
            await _claims(replica_b)
            with psycopg.connect(pg_url) as conn:
                return (
                    conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None
                )

        await wait_until(ended, timeout=20, what="B's claim ends A's session that blocks B")
        await asyncio.wait_for(renewal, 10)  # B's renewal went through
    finally:
        await frozen.close()
        await renewing.close()
