"""The database goes away and comes back under a live sidecar (issue 34; docs/operate/outages.md).

One ``turnwire serve`` runs on a PostgreSQL cluster of this module's own (``support.pg_cluster``:
``initdb`` + ``pg_ctl`` on a free port, never the suite's shared server), reached through a
cuttable loopback proxy (``support.tcp_proxy``). Faults: the cluster restarted with ``pg_ctl``
(``stop -m fast``, then ``start``), the link reset (a closed port) and blackholed (a cut route:
nothing answers) for ``OUTAGE_SECONDS``. Checked:

- while the database is gone, health reports NOT_SERVING (the liveness status stays SERVING, so a
  liveness probe restarts nothing) and a new call is refused at once with
  ``UNAVAILABLE`` (reason ``STORE_UNAVAILABLE``) and a ``RetryInfo`` delay, naming no address;
  once it is back, SERVING again and calls run: the pool and the listener recovered in place;
- a turn in flight across the outage completes once the database is back: its user message and
  its whole reply stored once, the turn ended once, its queue ticket gone, never recovered
  (the replica kept its lease).

Before (main at 5106143): health stayed SERVING throughout; a new call waited out the pool's
30 s timeout; a turn whose final write met the outage ended ``ERROR`` and stayed ``running`` in
the store, its lease renewed by its own replica forever (never recovered, its conversation's
queue blocked).

Size: ``TURNWIRE_STRESS_SCALE`` (default 1: 4 s outages; ``make stress``, 10: 30 s).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.pg_cluster import PgCluster
from support.sidecar import SidecarError, SidecarFactory, SidecarProcess, free_port, running_sidecar
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.api.standard_services import LIVENESS

pytestmark = pytest.mark.postgres

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
OUTAGE_SECONDS = 30.0 if SCALE >= 10 else 4.0
REFUSED_WITHIN_SECONDS = 3.0  # a refusal, not a wait for the pool's 30 s timeout
WORDS = [f"w{i}" for i in range(15)]
CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                "short": [{"text": "stored after the outage"}],
                # 15 chunks 100 ms apart: the answer ends, and its final write is due, mid-outage.
                "slow": [{"text": " ".join(WORDS), "delay_ms": 100}],
            }
        }
    },
    "checkpoint": {"interval_ms": 50},
    "store": {"pool_size": 4},
    "durability": {"lease_seconds": 6, "store_outage_seconds": 90},
}
_ids = itertools.count()


class Rig:
    """The module's cluster, the proxy in front of it and the sidecar behind the proxy."""

    def __init__(self, cluster: PgCluster, proxy: TcpProxy, sidecar: SidecarProcess) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.sidecar = sidecar

    def sql(self, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Run ``query`` on the cluster directly (not through the proxy)."""
        with psycopg.connect(self.cluster.url, autocommit=True) as conn:
            return list(conn.execute(query.encode(), params).fetchall())

    async def health(self, service: str = "") -> str:
        """The health status's name for ``service`` (the overall one by default), or
        ``unreachable``."""
        async with grpc.aio.insecure_channel(self.sidecar.target) as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=5
                )
            except grpc.RpcError:
                return "unreachable"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    async def wait_health(self, status: str, timeout: float) -> None:  # noqa: ASYNC109
        async def reached() -> bool:
            return await self.health() == status

        await wait_until(reached, timeout=timeout, what=f"health {status}\n{self.sidecar.log_text()[-3000:]}")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with PgCluster() as cluster, TcpProxy("127.0.0.1", cluster.port) as proxy:
        workdir: Path = tmp_path_factory.mktemp("store-outage")
        store_url = f"postgresql://postgres@{proxy.address}/postgres"
        with running_sidecar(workdir, CONFIG, store_url=store_url) as sidecar:
            yield Rig(cluster, proxy, sidecar)


async def replay(events: list[event_pb2.TurnEvent]) -> AsyncIterator[event_pb2.TurnEvent]:
    for event in events:
        yield event


def new_conversation() -> str:
    return f"outage-{next(_ids)}"


async def assert_refused_at_once(rig: Rig, client: TurnwireClient) -> None:
    """A new turn is refused within :data:`REFUSED_WITHIN_SECONDS`: UNAVAILABLE, a retry hint,
    no address of the database in the message."""
    started = time.monotonic()
    with pytest.raises(TurnwireError) as refused:
        await collect(client.chat(new_conversation(), "are you there?", model="scripted:short"))
    took = time.monotonic() - started
    error = refused.value
    assert error.code == grpc.StatusCode.UNAVAILABLE, error
    assert error.reason == "STORE_UNAVAILABLE", error
    assert took < REFUSED_WITHIN_SECONDS, f"refused after {took:.1f} s"
    assert error.status is not None
    assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in error.status.details), error
    for secret in ("127.0.0.1", str(rig.proxy.port), str(rig.cluster.port), "postgres@"):
        assert secret not in error.message, error.message


async def assert_serves_again(rig: Rig, client: TurnwireClient) -> None:
    await rig.wait_health("SERVING", timeout=30)
    result = await collect(client.chat(new_conversation(), "hello again", model="scripted:short"))
    assert result.status_name == "COMPLETED", result.error


@pytest.mark.parametrize("how", ["reset", "blackhole"])
async def test_while_the_database_is_unreachable_calls_are_refused_at_once_and_health_follows(
    rig: Rig, how: str
) -> None:
    async with TurnwireClient(rig.sidecar.target) as client:
        await assert_serves_again(rig, client)
        rig.proxy.cut(how)  # type: ignore[arg-type]
        try:
            await rig.wait_health("NOT_SERVING", timeout=15)
            assert await rig.health(LIVENESS) == "SERVING", "a liveness probe would restart it"
            await assert_refused_at_once(rig, client)
            await asyncio.sleep(OUTAGE_SECONDS)  # the outage's length is the fault being injected
            await assert_refused_at_once(rig, client)
            assert await rig.health(LIVENESS) == "SERVING"
        finally:
            rig.proxy.restore()
        await assert_serves_again(rig, client)


@pytest.mark.parametrize("fault", ["restart", "blackhole"])
async def test_a_turn_in_flight_across_an_outage_completes_once_the_database_is_back(
    rig: Rig, fault: str
) -> None:
    conversation = new_conversation()
    async with TurnwireClient(rig.sidecar.target) as client:
        await assert_serves_again(rig, client)
        events = aiter(client.chat(conversation, "tell me a long story", model="scripted:slow"))
        seen = [await anext(events)]
        while seen[-1].WhichOneof("event") != "text_delta":
            seen.append(await anext(events))  # up to the first chunk: the turn is stored and running
        if fault == "restart":
            await asyncio.to_thread(rig.cluster.stop)
        else:
            rig.proxy.cut("blackhole")
        try:
            await rig.wait_health("NOT_SERVING", timeout=15)
            await asyncio.sleep(OUTAGE_SECONDS)  # the outage's length is the fault being injected
        finally:
            if fault == "restart":
                await asyncio.to_thread(rig.cluster.start)
            else:
                rig.proxy.restore()
        seen.extend([event async for event in events])
        result = await collect(replay(seen))
        assert result.status_name == "COMPLETED", f"{result.error}\n{rig.sidecar.log_text()[-3000:]}"
        assert result.text == " ".join(WORDS)
        await assert_serves_again(rig, client)
        history = await client.get_conversation(conversation)
    roles = [message_pb2.Role.Name(message.role) for message in history.messages]
    assert roles == ["ROLE_USER", "ROLE_ASSISTANT"], roles
    turns = rig.sql("SELECT state, recovery_count FROM turns WHERE conversation_id = %s", (conversation,))
    assert turns == [("completed", 0)], turns
    assert rig.sql("SELECT count(*) FROM turn_queue WHERE conversation_id = %s", (conversation,)) == [(0,)]


async def test_a_turn_whose_end_outlasts_the_patience_is_recovered_once_the_database_is_back(
    rig: Rig, sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """The outage lasts past ``durability.store_outage_seconds`` (1 s here): the caller gets
    ``UNAVAILABLE``; the turn, still running in the store, is recovered once the database is back
    (its replica gives up the lease, a claim takes it) and its conversation takes new turns.

    Before: the replica renewed the stranded turn's lease for as long as it lived: the turn
    stayed ``running`` and its conversation's later turns waited behind it."""
    config = {**CONFIG, "durability": {"lease_seconds": 6, "store_outage_seconds": 1}}
    conversation = new_conversation()
    with TcpProxy("127.0.0.1", rig.cluster.port) as proxy:
        store_url = f"postgresql://postgres@{proxy.address}/postgres"
        sidecar = await sidecar_factory(config, workdir=tmp_path / "impatient", store_url=store_url).start()
        async with TurnwireClient(sidecar.target) as client:
            events = aiter(client.chat(conversation, "tell me a long story", model="scripted:slow"))
            seen = [await anext(events)]
            while seen[-1].WhichOneof("event") != "text_delta":
                seen.append(await anext(events))  # the turn is stored and running
            proxy.cut("reset")
            try:
                seen.extend([event async for event in events])  # it ends while the link is cut
            finally:
                proxy.restore()
            result = await collect(replay(seen))
            assert result.status_name == "ERROR", result
            with pytest.raises(TurnwireError) as ended:
                result.raise_for_error()
            assert ended.value.reason == "STORE_UNAVAILABLE", ended.value

            def turn_state() -> list[tuple[object, ...]]:
                return rig.sql(
                    "SELECT state, recovery_count FROM turns WHERE conversation_id = %s", (conversation,)
                )

            await wait_until(
                lambda: turn_state() == [("completed", 1)],
                timeout=60,
                what=f"the stranded turn recovered (now {turn_state()})\n{sidecar.log_text()[-3000:]}",
            )
            follow_up = await collect(client.chat(conversation, "and then?", model="scripted:short"))
            assert follow_up.status_name == "COMPLETED", follow_up.error
            history = await client.get_conversation(conversation)
        # Its log told of the outage (its own lines, the driver's text in them, psycopg's pool when it
        # logged) without the store's address.
        log = sidecar.log_text()
        assert 'connection to server at "<host>", port <port> failed' in log, log[-3000:]
        assert str(proxy.port) not in log, [line for line in log.splitlines() if str(proxy.port) in line]
    roles = [message_pb2.Role.Name(message.role) for message in history.messages]
    assert roles == ["ROLE_USER", "ROLE_ASSISTANT", "ROLE_USER", "ROLE_ASSISTANT"], roles
    assert rig.sql("SELECT count(*) FROM turn_queue WHERE conversation_id = %s", (conversation,)) == [(0,)]


async def test_a_replica_started_while_the_database_is_unreachable_comes_up_once_it_answers(
    rig: Rig, sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """A replica (re)started during a database restart waits for it (up to
    ``durability.store_outage_seconds``) instead of exiting; a database that refuses who
    connects (no such database) fails the start at once, naming the cause.

    Before: the start failed at once with "cannot open the store" whenever the database did not
    answer (a killed replica restarted mid-restart stayed down)."""
    with TcpProxy("127.0.0.1", rig.cluster.port) as proxy:
        proxy.cut("reset")
        store_url = f"postgresql://postgres@{proxy.address}/postgres"
        sidecar = sidecar_factory(CONFIG, workdir=tmp_path / "early", store_url=store_url)
        starting = asyncio.ensure_future(sidecar.start())
        try:
            await wait_until(
                lambda: "opening the store failed" in sidecar.log_text() or starting.done(),
                timeout=60,
                what="the start waits for the database",
            )
            assert not starting.done(), sidecar.log_text()
        finally:
            proxy.restore()
        await starting
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat(new_conversation(), "hello", model="scripted:short"))
        assert result.status_name == "COMPLETED", result.error

    refused = sidecar_factory(
        CONFIG,
        workdir=tmp_path / "refused",
        store_url=f"postgresql://postgres@127.0.0.1:{rig.cluster.port}/no_such_database",
    )
    began = time.monotonic()
    with pytest.raises(SidecarError, match='database "no_such_database" does not exist'):
        await refused.start()
    assert time.monotonic() - began < 30, "a refusal is not waited out"


async def test_a_stop_signal_ends_a_starts_wait_for_the_database_and_sighup_does_not_kill_it(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """A replica waiting at start for a database that does not answer (up to
    ``durability.store_outage_seconds``, 90 s here) stops at once on SIGTERM, exit 0: nothing
    was served. A SIGHUP meanwhile (a renewed certificate) is kept for once it is up.

    Before: SIGTERM was held until the wait ended (then exit 1), longer than a supervisor waits
    before SIGKILL (docs/operate/stopping.md); SIGHUP killed the process (exit 129)."""
    store_url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"  # nothing listens there
    sidecar = sidecar_factory(CONFIG, workdir=tmp_path, store_url=store_url)
    starting = asyncio.ensure_future(sidecar.start())
    await wait_until(
        lambda: "opening the store failed" in sidecar.log_text() or starting.done(),
        timeout=60,
        what="the start waits for the database",
    )
    assert not starting.done(), sidecar.log_text()
    sidecar.send_signal(signal.SIGHUP)
    sidecar.send_signal(signal.SIGTERM)
    assert await sidecar.wait(timeout=15) == 0, sidecar.log_text()
    assert "stopped by a signal while waiting for the store (postgres)" in sidecar.log_text()
    with pytest.raises(SidecarError):
        await starting
