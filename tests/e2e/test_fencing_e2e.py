"""Fencing a replica that lost its lease (issue 34; docs/semantics.md §5, "Fencing").

Two real ``turnwire serve`` replicas share a fresh PostgreSQL database with a short lease. Replica
A runs a turn; A is then paused (SIGSTOP) or cut off from the database (a loopback TCP proxy
between A and PostgreSQL resets A's connections, or stops answering, while B reaches the database
directly) for longer than its lease, between its writes or inside one. B takes the turn over once
and completes it. When A goes on (SIGCONT, or the proxy forwards again), A writes nothing more for
the turn and its caller's stream ends with ``LEASE_LOST`` (``ABORTED``, retryable: follow the turn
with ResumeTurn); the turn is completed once, its events stored once.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from google.rpc import error_details_pb2
from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import postgres_database
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until

from turnwire_client import TurnwireClient
from turnwire_client.v1 import event_pb2, message_pb2

LEASE_SECONDS = 1.5
WORDS = [f"w{i}" for i in range(60)]
REST = "and that is the end."


def config() -> dict[str, object]:
    return {
        "providers": {
            "scripted": {
                # Long enough that A still streams when it comes back (60 words, 6 s).
                "scripts": {"slow": [{"text": " ".join(WORDS), "delay_ms": 100, "retry": {"text": REST}}]}
            }
        },
        "checkpoint": {"interval_ms": 20},
        "store": {"pool_size": 3},
        "durability": {"lease_seconds": LEASE_SECONDS},
    }


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def sql(url: str, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute(query, params).fetchall()]


def stored_state(url: str, request_id: str) -> list[Any]:
    """Everything the turn has in the database: its record, its messages' parts, its events."""
    return [
        sql(
            url,
            "SELECT state, owner, lease_epoch, recovery_count FROM turns WHERE request_id = %s",
            (request_id,),
        ),
        sql(url, "SELECT message_id, idx, data FROM parts ORDER BY message_id, idx"),
        sql(
            url,
            "SELECT first_sequence_number, last_sequence_number, data FROM turn_events"
            " WHERE request_id = %s ORDER BY first_sequence_number",
            (request_id,),
        ),
    ]


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


async def _start_on_a(client: TurnwireClient, url: str, request_id: str) -> tuple[Any, list[Any]]:
    """A turn on A, read until some of it streamed and a checkpoint of it is stored."""
    stream = client.chat("fenced", "a story", request_id=request_id, model="scripted:slow")
    seen = [await anext(stream) for _ in range(6)]
    await wait_until(
        lambda: bool(sql(url, "SELECT 1 FROM messages WHERE id = %s", (f"tw-a-{request_id}",))),
        what="a checkpoint of A's partial reply",
    )
    return stream, seen


def _sessions_of_a(url: str, request_id: str) -> str:
    """The condition on ``pg_stat_activity`` that picks replica A's sessions: A runs the turn,
    and its sessions carry its replica id (``turnwire/<id>``, the turn's owner)."""
    ((owner,),) = sql(url, "SELECT owner FROM turns WHERE request_id = %s", (request_id,))
    return f"application_name = 'turnwire/{owner}'"


async def _pause(a: SidecarProcess, url: str, request_id: str, where: str) -> None:
    """SIGSTOP A ``between`` its writes (none of its sessions busy) or ``inside`` one: a session
    of A holding a transaction open, waiting for A (``ClientRead``), with the turn's row lock
    among its locks when it is a fenced write. PostgreSQL ends no such session by itself; B's
    claims end it once A's lease lapsed (``stuck_sessions``), or the takeover would wait forever."""
    mine = _sessions_of_a(url, request_id)
    if where == "between":
        wanted = f"SELECT COUNT(*) = 0 FROM pg_stat_activity WHERE {mine} AND state <> 'idle'"
    else:
        wanted = (
            f"SELECT COUNT(*) > 0 FROM pg_stat_activity WHERE {mine} AND state = 'active'"
            " AND wait_event = 'ClientRead' AND xact_start IS NOT NULL"
        )
    for _ in range(2000):
        a.send_signal(signal.SIGSTOP)
        if sql(url, wanted) == [(True,)] and sql(url, wanted) == [(True,)]:
            return
        a.send_signal(signal.SIGCONT)
    raise AssertionError(f"replica A was never paused {where} a write in 2000 tries")


async def _taken_over_and_completed(url: str, request_id: str, b: SidecarProcess) -> None:
    def completed_by_b() -> bool:
        return sql(url, "SELECT state FROM turns WHERE request_id = %s", (request_id,)) == [("completed",)]

    try:
        await wait_until(completed_by_b, timeout=60, what="B takes the turn over and completes it")
    except AssertionError as error:  # say where it stands
        turn = sql(
            url,
            "SELECT state, owner, lease_epoch, lease_until FROM turns WHERE request_id = %s",
            (request_id,),
        )
        sessions = sql(
            url, "SELECT state, left(query, 80) FROM pg_stat_activity WHERE datname = current_database()"
        )
        raise AssertionError(
            f"{error}; turn {turn}; sessions {sessions}; B's log: {b.log_text()[-3000:]}"
        ) from None
    assert b.log_text().count("took over") == 1, "B took it over once"


async def _fenced_out(stream: Any, seen: list[Any]) -> None:
    """The rest of A's stream: it ends with LEASE_LOST."""
    events = seen + [event async for event in stream]
    ends = [e.turn_end for e in events if e.HasField("turn_end")]
    assert len(ends) == 1
    end = ends[0]
    assert end.status == event_pb2.TURN_STATUS_INTERRUPTED
    assert end.error.code == 10  # ABORTED
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) for d in end.error.details if d.Is(info.DESCRIPTOR))
    assert info.reason == "LEASE_LOST", end.error
    assert "ResumeTurn" in end.error.message


async def _completed_once(url: str, request_id: str, on_b: TurnwireClient) -> None:
    assert sql(url, "SELECT state, recovery_count FROM turns WHERE request_id = %s", (request_id,)) == [
        ("completed", 1)
    ]
    stored = await on_b.get_conversation("fenced")
    assert [m.id for m in stored.messages] == [stored.messages[0].id, f"tw-a-{request_id}"], "one answer"
    assert text_of(stored.messages[1]).endswith(REST), "B finished the answer in the same message"
    events = [event async for event in on_b.resume_turn(request_id)]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("turn_start") <= 1, "A's TurnStart once, if its batch committed before the claim"
    assert (kinds.count("attempt_start"), kinds.count("turn_end")) == (1, 1)
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers)), "each event stored once, in order"
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED


@pytest.mark.parametrize("where", ["between", "inside"])
async def test_a_replica_paused_past_its_lease_writes_nothing_for_the_turn_taken_over(
    sidecar_factory: SidecarFactory, pg_url: str, tmp_path: Path, where: str
) -> None:
    """``between``: A paused while none of its sessions is inside a write. ``inside``: paused
    inside one, its session holding its locks (the turn's row among them, when the write is a
    fenced one) and waiting for A."""
    a = sidecar_factory(config(), workdir=tmp_path / "a", store_url=pg_url)
    b = sidecar_factory(config(), workdir=tmp_path / "b", store_url=pg_url)
    await asyncio.gather(a.start(), b.start())
    on_a, on_b = TurnwireClient(a.target), TurnwireClient(b.target)
    try:
        stream, seen = await _start_on_a(on_a, pg_url, "r-pause")
        await _pause(a, pg_url, "r-pause", where)  # a long GC pause, a frozen VM
        try:
            await _taken_over_and_completed(pg_url, "r-pause", b)
            before = stored_state(pg_url, "r-pause")
        finally:
            a.send_signal(signal.SIGCONT)
        await _fenced_out(stream, seen)
        assert stored_state(pg_url, "r-pause") == before, "A wrote nothing after it lost the lease"
        await _completed_once(pg_url, "r-pause", on_b)
    finally:
        await on_a.close()
        await on_b.close()


@pytest.mark.parametrize("how", ["reset", "blackhole"])
async def test_a_replica_cut_off_from_the_database_writes_nothing_once_it_reconnects(
    sidecar_factory: SidecarFactory, pg_url: str, tmp_path: Path, how: str
) -> None:
    """``reset``: A's connections are refused (a closed port). ``blackhole``: nothing answers (a
    partition; the test proxy keeps the TCP streams alive, so the server's TCP timeouts never end
    A's sessions): a cut inside a write leaves A's session holding its locks, which B's claims
    end once A's lease lapsed."""
    server = urlsplit(pg_url)
    with TcpProxy(server.hostname or "127.0.0.1", server.port or 5432) as proxy:
        through_proxy = server._replace(netloc=f"{server.username}@127.0.0.1:{proxy.port}").geturl()
        a = sidecar_factory(config(), workdir=tmp_path / "a", store_url=through_proxy)
        b = sidecar_factory(config(), workdir=tmp_path / "b", store_url=pg_url)
        await asyncio.gather(a.start(), b.start())
        on_a, on_b = TurnwireClient(a.target), TurnwireClient(b.target)
        try:
            request_id = f"r-cut-{how}"
            stream, seen = await _start_on_a(on_a, pg_url, request_id)
            proxy.cut(how)  # type: ignore[arg-type]  # A alone loses the database; B still reaches it
            try:

                def claimed_by_b() -> bool:
                    rows = sql(pg_url, "SELECT lease_epoch FROM turns WHERE request_id = %s", (request_id,))
                    return rows == [(1,)]

                await wait_until(claimed_by_b, timeout=60, what="B takes the turn over")
            finally:
                proxy.restore()
            await _fenced_out(stream, seen)
            await _taken_over_and_completed(pg_url, request_id, b)
            await _completed_once(pg_url, request_id, on_b)
            assert f"lost the lease of turn '{request_id}'" in a.log_text()
        finally:
            await on_a.close()
            await on_b.close()
