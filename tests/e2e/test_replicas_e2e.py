"""Several replicas on one PostgreSQL database (issue 11; docs/semantics.md §5, §8).

Real ``turnwire serve`` processes share a fresh database: turns of one conversation run one at a
time in order of acceptance whichever replica each call reached; turns of different
conversations run at once on different replicas; ``CancelChat`` and ``ResumeTurn`` work from a
replica other than the one running the turn; a replica killed mid-turn has the turn recovered by
a survivor once its lease lapses, exactly once with two survivors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import postgres_database
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

LEASE_SECONDS = 1.5
WORDS = [f"w{i}" for i in range(40)]
REST = "and that is the end."


def config() -> dict[str, object]:
    return {
        "providers": {
            "scripted": {
                "scripts": {
                    "short": [{"text": "one two three four", "delay_ms": 10}],
                    "slow": [{"text": " ".join(WORDS), "delay_ms": 50, "retry": {"text": REST}}],
                }
            }
        },
        "checkpoint": {"interval_ms": 20},
        "store": {"pool_size": 5},
        "durability": {"lease_seconds": LEASE_SECONDS},
    }


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
async def replicas(
    sidecar_factory: SidecarFactory, pg_url: str, tmp_path: Path
) -> AsyncIterator[list[SidecarProcess]]:
    started = [
        sidecar_factory(config(), workdir=tmp_path / f"replica-{n}", store_url=pg_url) for n in range(3)
    ]
    await asyncio.gather(*(replica.start() for replica in started))  # they migrate together too
    yield started


def sql(url: str, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute(query, params).fetchall()]


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


async def test_one_conversation_over_three_replicas_runs_first_in_first_out(
    replicas: list[SidecarProcess], pg_url: str
) -> None:
    clients = [TurnwireClient(replica.target) for replica in replicas]
    calls = []
    try:
        for n in range(30):
            client = clients[n % 3]
            calls.append(
                asyncio.ensure_future(
                    collect(client.chat("shared", f"q{n}", request_id=f"r{n:02d}", model="scripted:short"))
                )
            )

            def accepted(count: int = n + 1) -> bool:
                # Queued (a ticket) or already answered; UNION: the holder briefly has both.
                (seen,) = sql(
                    pg_url,
                    "SELECT COUNT(*) FROM (SELECT request_id FROM turn_queue WHERE conversation_id = 'shared'"
                    " UNION SELECT request_id FROM turns WHERE conversation_id = 'shared'"
                    " AND state <> 'running') AS accepted",
                )[0]
                return bool(int(seen) >= count)  # type: ignore[call-overload]

            await wait_until(accepted, what=f"call {n} is accepted (queued)")
        results = await asyncio.gather(*calls)
        assert [r.status_name for r in results] == ["COMPLETED"] * 30
        stored = await clients[0].get_conversation("shared")
        roles = [m.role for m in stored.messages]
        assert roles == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * 30, "nothing interleaved"
        assert [text_of(m) for m in stored.messages[::2]] == [f"q{n}" for n in range(30)], (
            "FIFO by acceptance"
        )
        assert [m.id for m in stored.messages[1::2]] == [f"tw-a-r{n:02d}" for n in range(30)]
        assert sql(pg_url, "SELECT COUNT(*) FROM turn_queue") == [(0,)], "every ticket released"
    finally:
        for client in clients:
            await client.close()


async def test_different_conversations_run_at_once_on_different_replicas(
    replicas: list[SidecarProcess],
) -> None:
    clients = [TurnwireClient(replica.target) for replica in replicas]
    try:
        streams = [client.chat(f"par-{n}", "go", model="scripted:slow") for n, client in enumerate(clients)]
        firsts = [await anext(stream) for stream in streams]  # every turn started ...
        assert all(first.HasField("turn_start") for first in firsts)
        seconds = [await anext(stream) for stream in streams]  # ... and streams, none finished
        assert not any(event.HasField("turn_end") for event in seconds)
        results = await asyncio.gather(*(collect(stream) for stream in streams))
        assert all(result.status_name == "COMPLETED" for result in results)
    finally:
        for client in clients:
            await client.close()


async def test_cancel_and_resume_from_another_replica(replicas: list[SidecarProcess]) -> None:
    a, b = TurnwireClient(replicas[0].target), TurnwireClient(replicas[1].target)
    try:
        # Resume on B a stream A produces: the same events, byte for byte.
        on_a = a.chat("follow", "tell me", request_id="r-follow", model="scripted:slow")
        first = await anext(on_a)
        followed_task = asyncio.ensure_future(collect(b.resume_turn("r-follow")))
        produced = [first] + [event async for event in on_a]
        followed = await followed_task
        assert [e.SerializeToString() for e in followed.events] == [e.SerializeToString() for e in produced]

        # Cancel on B a turn A runs.
        running = a.chat("stop", "tell me", request_id="r-stop", model="scripted:slow")
        events = [await anext(running)]
        assert await b.cancel_chat("r-stop")
        events += [event async for event in running]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
        assert not await b.cancel_chat("r-stop"), "cancelling a finished turn is a no-op"
    finally:
        await a.close()
        await b.close()


async def test_a_killed_replicas_turn_is_recovered_once_by_a_survivor(
    replicas: list[SidecarProcess], pg_url: str
) -> None:
    victim = TurnwireClient(replicas[0].target)
    seen = 0
    try:
        async for event in victim.chat(
            "crash", "a story", request_id="r-crash", model="scripted:slow", disconnect="continue"
        ):
            seen += event.HasField("text_delta")
            if seen == 5:

                def checkpointed() -> bool:
                    return bool(sql(pg_url, "SELECT 1 FROM messages WHERE id = 'tw-a-r-crash'"))

                await wait_until(checkpointed, what="a checkpoint of the partial reply")
                replicas[0].kill()
                break
    except Exception:  # the stream breaks with the process
        pass
    finally:
        await victim.close()

    def finished() -> bool:
        return sql(pg_url, "SELECT state FROM turns WHERE request_id = 'r-crash'") == [("completed",)]

    await wait_until(finished, timeout=LEASE_SECONDS * 10, what="a survivor recovers the turn")
    assert sql(pg_url, "SELECT recovery_count FROM turns WHERE request_id = 'r-crash'") == [(1,)], "once"
    survivors = replicas[1:]
    took_over = sum(replica.log_text().count("took over") for replica in survivors)
    assert took_over == 1, "exactly one survivor claimed it"
    async with TurnwireClient(survivors[0].target) as client:
        stored = await client.get_conversation("crash")
        assert [m.id for m in stored.messages] == [stored.messages[0].id, "tw-a-r-crash"]
        assert text_of(stored.messages[1]).endswith(REST), "the answer is finished in the same message"
        events = [event async for event in client.resume_turn("r-crash")]
        assert any(e.HasField("attempt_start") for e in events)
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED


async def test_a_killed_replicas_submissions_run_on_a_survivor_in_order(
    replicas: list[SidecarProcess], pg_url: str
) -> None:
    async with TurnwireClient(replicas[0].target) as client:
        for n in range(3):
            await client.submit_messages(
                "subs", f"q{n}", submission_id=f"s{n}", model="scripted:slow" if n == 0 else "scripted:short"
            )

        def first_runs() -> bool:
            return sql(pg_url, "SELECT state FROM submissions WHERE id = 's0'") == [("running",)]

        await wait_until(first_runs, what="the first submission runs on replica 0")
    replicas[0].kill()

    def all_done() -> bool:
        return sql(pg_url, "SELECT state FROM submissions ORDER BY seq") == [("completed",)] * 3

    await wait_until(all_done, timeout=LEASE_SECONDS * 12, what="the survivors run every submission")
    async with TurnwireClient(replicas[1].target) as client:
        stored = await client.get_conversation("subs")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * 3
    assert [text_of(m) for m in stored.messages[::2]] == ["q0", "q1", "q2"]
    assert text_of(stored.messages[1]).endswith(REST), "the running one was recovered in place"


async def test_watch_on_another_replica_follows_a_pending_submission_to_its_end(
    replicas: list[SidecarProcess],
) -> None:
    a, b = TurnwireClient(replicas[0].target), TurnwireClient(replicas[1].target)
    try:
        await a.submit_messages("watched", "first", submission_id="w-0", model="scripted:slow")
        await a.submit_messages("watched", "second", submission_id="w-1", model="scripted:short")
        watched = await collect(b.watch_submission("w-1"))  # pending on A when the watch starts
        assert watched.status_name == "COMPLETED"
        assert watched.events[0].HasField("turn_start")
        assert (await b.get_submission("w-1")).state == chat_service_pb2.SUBMISSION_STATE_COMPLETED
    finally:
        await a.close()
        await b.close()


async def test_submissions_a_saturated_replica_accepts_run_on_a_free_one_in_order(
    sidecar_factory: SidecarFactory, pg_url: str, tmp_path: Path
) -> None:
    """Submissions run on whichever replica is free: A and B run one submission turn at most
    (``durability.max_running_submissions: 1``), C the default. With A and B busy, what they
    accept waits unclaimed and C runs it; consecutive submissions of one conversation on two
    replicas still go first in, first out by acceptance."""

    def bounded(limit: int | None) -> dict[str, object]:
        settings = config()
        if limit is not None:
            settings["durability"] = {"lease_seconds": LEASE_SECONDS, "max_running_submissions": limit}
        return settings

    a, b, c = (
        sidecar_factory(bounded(limit), workdir=tmp_path / name, store_url=pg_url)
        for name, limit in (("a", 1), ("b", 1), ("c", None))
    )
    await asyncio.gather(a.start(), b.start(), c.start())
    on_a, on_b = TurnwireClient(a.target), TurnwireClient(b.target)

    def state(submission_id: str) -> object:
        return sql(pg_url, "SELECT state FROM submissions WHERE id = %s", (submission_id,))[0][0]

    try:
        # A's one slot: a slow turn of another conversation; B's: the first of "shared".
        await on_a.submit_messages("busy", "slow", submission_id="busy", model="scripted:slow")
        await on_b.submit_messages("shared", "q0", submission_id="x0", model="scripted:slow")
        await wait_until(lambda: state("busy") == "running", what="A runs its slow submission")
        await wait_until(lambda: state("x0") == "running", what="B runs the first of the conversation")
        # Accepted by the full replicas: left unclaimed, C claims them; x1 waits for x0 on B.
        await on_a.submit_messages("shared", "q1", submission_id="x1", model="scripted:short")
        await on_b.submit_messages("shared", "q2", submission_id="x2", model="scripted:short")
        await on_a.submit_messages("other", "q3", submission_id="x3", model="scripted:short")

        def all_done() -> bool:
            return sql(pg_url, "SELECT DISTINCT state FROM submissions") == [("completed",)]

        await wait_until(all_done, timeout=20, what="every submission completes")
        owners = {
            request_id: owner for request_id, owner in sql(pg_url, "SELECT request_id, owner FROM turns")
        }
        assert len({owners["busy"], owners["x0"], owners["x1"]}) == 3, owners
        assert owners["x1"] == owners["x3"], "the free replica ran what A accepted"
        assert owners["x2"] != owners["busy"], "never the full replica"
        stored = await on_a.get_conversation("shared")
        assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * 3
        assert [text_of(m) for m in stored.messages[::2]] == ["q0", "q1", "q2"], "FIFO by acceptance"
        assert sql(pg_url, "SELECT COUNT(*) FROM turn_queue") == [(0,)], "every ticket released"
    finally:
        await on_a.close()
        await on_b.close()
