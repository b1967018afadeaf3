"""The PostgreSQL store's admission of a turn when its connection is lost mid-commit
(store/postgres/admission.py, docs/semantics.md §5 "Admission on PostgreSQL"): the COMMIT's outcome
is unknown, and the store resolves it before deciding what the caller gets.

The loss is made at a chosen point of the turn's one transaction: the connection is closed
right after the server committed it (the answer lost) or before the ``COMMIT`` was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import psycopg
import pytest
from support.stores import StoreBackend, leased_turn, postgres_database
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store.errors import StoreUnreachable
from turnwire_server.store.postgres import PostgresStore, db
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
)

pytestmark = pytest.mark.postgres

T0 = dt.datetime.now(dt.UTC)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database of its own on the test server (dropped afterwards)."""
    with postgres_database() as url:
        yield url


def _user(message_id: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = message_id
    return message


def _lose_next_flight(
    monkeypatch: pytest.MonkeyPatch, when: Literal["after_commit", "before_commit"]
) -> list[int]:
    """Make the store's next pipelined transaction (``db.flight``) lose its connection: closed
    once the server committed it (``after_commit``: its answer lost) or before its ``COMMIT``
    is sent (``before_commit``: nothing stored). Returns a list that counts the losses made."""
    real_flight = db.flight
    lost: list[int] = []

    @contextlib.asynccontextmanager
    async def flight(conn: Any) -> AsyncIterator[None]:
        if lost:
            async with real_flight(conn):
                yield
            return
        lost.append(1)
        if when == "before_commit":
            async with real_flight(conn):
                yield
                await conn.close()
            return
        async with real_flight(conn):
            yield
        await conn.close()
        raise psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")

    monkeypatch.setattr(db, "flight", flight)
    return lost


@pytest.mark.parametrize("when", ["after_commit", "before_commit"])
async def test_an_admission_whose_connection_is_lost_at_commit_resolves_the_commit(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, when: Literal["after_commit", "before_commit"]
) -> None:
    """The one-flight admission on an idle conversation loses its connection at its ``COMMIT``.
    Whether the server committed it or not, the caller is admitted once, with its own input
    stored once and read back in its history (never ``ALREADY_EXISTS`` for its own request),
    holding the conversation's one ticket, which it gives up on leaving."""
    store = PostgresStore(pg_url)
    await store.open()
    check = StoreBackend("postgres", url=pg_url)
    try:
        lost = _lose_next_flight(monkeypatch, when)
        turn = leased_turn("r1", "c", "replica-a", start_time=T0)
        async with store.admit_turn(
            turn, [_user("u1")], lease_seconds=30, read_compaction=True, queued=lambda _: None
        ) as admission:
            assert lost == [1]
            assert admission.history is not None
            assert [m.id for m in admission.history] == ["u1"]
            assert check.sql("SELECT request_id, owner FROM turn_queue") == [("r1", "replica-a")]
        assert check.sql("SELECT request_id, state FROM turns") == [("r1", "running")]
        assert check.sql("SELECT id FROM messages") == [("u1",)]
        assert check.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)]
    finally:
        await store.close()
        await check.close()


@pytest.mark.parametrize("when", ["after_commit", "before_commit"])
async def test_a_first_reservation_whose_flight_lost_its_connection_is_reserved_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, when: Literal["after_commit", "before_commit"]
) -> None:
    """The flight carries the first step's reservation (docs/cost.md, "What it costs per
    request") and loses its connection at its ``COMMIT``. Committed (the answer lost): the
    reservation is stored once and the admission's grant is an empty one, which the first step
    does not take as covering it (it settles the reservation at zero). Not committed: the waiting
    path carries it, its grant returned. Either way, reserved once."""
    store = PostgresStore(pg_url)
    await store.open()
    check = StoreBackend("postgres", url=pg_url)
    key = BudgetKey("conversation", "c")
    try:
        lost = _lose_next_flight(monkeypatch, when)
        turn = leased_turn("r1", "c", "replica-a", start_time=T0)
        ask = BudgetAsk(prompt_tokens=100, prompt_usd=0.0, usd_per_output_token=0.0, max_output=300)
        charge = BudgetCharge(
            "r1", "c", turn.lease, (BudgetLimits(key, tokens=1_000, conversation_id="c"),), ask=ask
        )
        async with store.admit_turn(
            turn, [_user("u1")], lease_seconds=30, read_compaction=False, queued=lambda _: None, budget=charge
        ) as admission:
            assert lost == [1]
            if when == "after_commit":
                assert admission.budget == BudgetGrant()
            else:
                assert admission.budget is not None and admission.budget.tokens == 400
        assert await store.budget_spends([key]) == {key: BudgetSpend(0, 0.0, 400, 0.0)}
        assert check.sql("SELECT request_id, tokens FROM budget_reservations") == [("r1", 400)]
    finally:
        await store.close()
        await check.close()


@pytest.mark.parametrize("taking", ["turn_lock", "reserve_place", "reserve_place_if_idle"])
async def test_a_ticket_whose_answer_was_lost_is_given_up(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, taking: str
) -> None:
    """A ticket's taking committed and its answer was lost (``StoreUnreachable``, in flight): the
    caller fails, and the ticket it may hold is given up, instead of staying in line under this
    replica's renewed leases with no turn behind it; the next turn takes the lock."""
    store = PostgresStore(pg_url)
    await store.open()
    check = StoreBackend("postgres", url=pg_url)
    real = store._simple_query

    async def answer_lost(what: str, sql: bytes, params: Any) -> list[Any]:
        await real(what, sql, params)
        raise StoreUnreachable("connection lost with the answer", in_flight=True)

    try:
        monkeypatch.setattr(store, "_simple_query", answer_lost)
        with pytest.raises(StoreUnreachable):
            if taking == "turn_lock":
                async with store.turn_lock("c", request_id="r1", owner="replica-a", lease_seconds=30):
                    raise AssertionError("the lock is not held when its taking failed")
            else:
                idle = taking == "reserve_place_if_idle"
                await store.reserve_place("c", "r1", owner="replica-a", lease_seconds=30, only_if_idle=idle)
        monkeypatch.undo()
        await wait_until(
            lambda: check.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)], what="the ticket is given up"
        )
        async with (
            asyncio.timeout(10),
            store.turn_lock("c", request_id="r2", owner="replica-a", lease_seconds=30),
        ):
            pass
    finally:
        await store.close()
        await check.close()


def _lose_answers_and_releases(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, database_back: asyncio.Event
) -> Any:
    """From now on ``store``'s ticket queries commit and lose their answers, and the background
    releases of a lost ticket fail until ``database_back`` is set. Returns the real query (put it
    back with ``monkeypatch.setattr(store, "_simple_query", …)``)."""
    real_query, real_write = store._simple_query, store._write_batched

    async def answer_lost(what: str, sql: bytes, params: Any) -> list[Any]:
        await real_query(what, sql, params)
        raise StoreUnreachable("connection lost with the answer", in_flight=True)

    async def failing_release(what: str, body: Any, **kwargs: Any) -> Any:
        if "answer lost" in what and not database_back.is_set():
            raise StoreUnreachable("database unreachable")
        return await real_write(what, body, **kwargs)

    monkeypatch.setattr(store, "_simple_query", answer_lost)
    monkeypatch.setattr(store, "_write_batched", failing_release)
    return real_query


async def test_a_lost_tickets_late_release_spares_the_same_requests_retaken_ticket(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ticket's taking lost its answer while the database was failing, so its release is
    retried in the background; meanwhile the request is retried (same request id, same replica)
    and holds the conversation's lock. The late release must not delete that held ticket: else
    the next request takes the lock while the first still holds it (two turns at once)."""
    store = PostgresStore(pg_url)
    await store.open()
    check = StoreBackend("postgres", url=pg_url)
    database_back = asyncio.Event()
    try:
        real_query = _lose_answers_and_releases(store, monkeypatch, database_back)
        with pytest.raises(StoreUnreachable):
            async with store.turn_lock("c", request_id="r1", owner="replica-a", lease_seconds=30):
                raise AssertionError("the lock is not held when its taking failed")
        monkeypatch.setattr(store, "_simple_query", real_query)
        async with store.turn_lock("c", request_id="r1", owner="replica-a", lease_seconds=30):
            database_back.set()  # the background release now commits
            await wait_until(lambda: not store._releases, what="the late release ran")
            assert check.sql("SELECT request_id FROM turn_queue") == [("r1",)], "the held ticket was deleted"
            second = asyncio.ensure_future(_hold("c", "r2", store))
            await wait_until(
                lambda: check.sql("SELECT request_id FROM turn_queue ORDER BY ticket") == [("r1",), ("r2",)],
                what="r2's ticket queued behind r1's",
            )
            assert not second.done(), "r2 took the conversation's lock while r1 still held it"
            second.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await second
    finally:
        await store.close()
        await check.close()


async def test_a_lost_tickets_late_release_still_runs_after_a_retry_that_took_nothing(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REJECT's admission (``reserve_place(only_if_idle=True)``) lost its answer with its ticket
    taken; its retry finds that ticket live and takes nothing. The late release still gives the
    lost ticket up: nothing of this process holds it."""
    store = PostgresStore(pg_url)
    await store.open()
    check = StoreBackend("postgres", url=pg_url)
    database_back = asyncio.Event()
    try:
        real_query = _lose_answers_and_releases(store, monkeypatch, database_back)
        with pytest.raises(StoreUnreachable):
            await store.reserve_place("c", "r1", owner="replica-a", lease_seconds=30, only_if_idle=True)
        monkeypatch.setattr(store, "_simple_query", real_query)
        head = await store.reserve_place("c", "r1", owner="replica-a", lease_seconds=30, only_if_idle=True)
        assert head == "r1"  # its own lost ticket: nothing taken
        database_back.set()
        await wait_until(
            lambda: check.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)], what="the lost ticket is given up"
        )
    finally:
        await store.close()
        await check.close()


async def _hold(conversation_id: str, request_id: str, store: PostgresStore) -> None:
    async with store.turn_lock(conversation_id, request_id=request_id, owner="replica-a", lease_seconds=30):
        pass


async def test_a_flight_cut_off_while_the_server_still_runs_it_is_admitted_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole flight, ``COMMIT`` included, reached the server, which waits for the
    conversation's write lock; the client's connection is cut then (a partition, a client-side
    timeout). Left alone, the server would commit it once the lock is free, after the store had
    looked and found nothing, and the waiting path would then find its own request id stored
    (``ALREADY_EXISTS`` for its own request, the turn stored and not run). The store ends that
    session before it looks: the caller is admitted once, its input stored once."""
    store = PostgresStore(pg_url)
    await store.open()
    check = StoreBackend("postgres", url=pg_url)
    holder = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    await holder.execute("BEGIN")
    await holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (db.CONVERSATION_LOCK_CLASS, "c"))
    real_flight = db.flight
    cut: list[int] = []

    @contextlib.asynccontextmanager
    async def flight(conn: Any) -> AsyncIterator[None]:
        if cut:
            async with real_flight(conn):
                yield
            return
        cut.append(1)
        with contextlib.suppress(psycopg.Error):
            async with conn.pipeline():
                await conn.execute(b"BEGIN")
                yield
                await conn.execute(b"COMMIT")
                conn.pgconn.pipeline_sync()
                conn.pgconn.nonblocking = 0
                conn.pgconn.flush()  # the server has it all …
                conn.pgconn.finish()  # … and the connection is cut before any answer
        raise psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")

    monkeypatch.setattr(db, "flight", flight)
    admitted: list[list[str]] = []

    async def admit() -> None:
        turn = leased_turn("r1", "c", "replica-a", start_time=T0)
        async with store.admit_turn(
            turn, [_user("u1")], lease_seconds=30, read_compaction=False, queued=lambda _: None
        ) as admission:
            assert admission.history is not None
            admitted.append([m.id for m in admission.history])

    task = asyncio.ensure_future(admit())
    try:
        await wait_until(lambda: cut == [1] and check.sql("SELECT COUNT(*) FROM turn_queue") == [(1,)])
        await holder.execute("COMMIT")  # the conversation's lock free: a live flight would commit now
        await asyncio.wait_for(task, 30)
        assert admitted == [["u1"]]
        assert check.sql("SELECT request_id, state FROM turns") == [("r1", "running")]
        assert check.sql("SELECT id FROM messages") == [("u1",)]
        assert check.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)]
    finally:
        task.cancel()
        await holder.close()
        await store.close()
        await check.close()
