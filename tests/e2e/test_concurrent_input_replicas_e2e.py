"""New input while a turn runs, across two replicas on one PostgreSQL database (issue 18;
docs/semantics.md §5): the strategy of a request that reaches replica B applies to the turn
replica A runs. REJECT sees A's turn through the store's queue; INTERRUPT and ROLLBACK stop it
on A through the store's cancel notification, carrying which request stopped it and how.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import StoreBackend, postgres_database
from support.turn_calls import call_status, chat, error_info, has_reply, transcript
from support.waiting import wait_until

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2

WORDS = [f"w{i}" for i in range(200)]
REJECT = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_REJECT
INTERRUPT = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT
ROLLBACK = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK

CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                "long": [{"text": " ".join(WORDS), "delay_ms": 50}],
                "short": [{"text": "ok"}],
            }
        }
    },
    "checkpoint": {"interval_ms": 20},
    "store": {"pool_size": 5},
}


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
async def stubs(
    sidecar_factory: SidecarFactory, pg_url: str, tmp_path: Path
) -> AsyncIterator[list[chat_service_pb2_grpc.ChatServiceStub]]:
    replicas: list[SidecarProcess] = [
        sidecar_factory(CONFIG, workdir=tmp_path / f"replica-{n}", store_url=pg_url) for n in range(2)
    ]
    await asyncio.gather(*(replica.start() for replica in replicas))
    yield [chat_service_pb2_grpc.ChatServiceStub(replica.channel()) for replica in replicas]


async def test_reject_on_one_replica_sees_the_turn_running_on_the_other(
    stubs: list[chat_service_pb2_grpc.ChatServiceStub],
) -> None:
    a, b = stubs
    first = chat(a, "pg-rej", "pg-rej-a", "long")
    await wait_until(first.text_seen, timeout=15, what="text streams on replica A")
    # A's reply stored by its first checkpoint: the transcript compared below is then A's whole
    # (CI once read it before that checkpoint and after, with nothing of the rejected request).
    await wait_until(
        lambda: has_reply(a, "pg-rej", "tw-a-pg-rej-a"), timeout=10, what="a checkpoint is stored"
    )
    before = await transcript(a, "pg-rej")
    rejected = chat(b, "pg-rej", "pg-rej-b", "short", REJECT)
    await asyncio.wait_for(rejected.task, 10)
    assert rejected.refused is not None
    assert rejected.refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(call_status(rejected.refused))
    assert (info.reason, info.metadata["running_request_id"]) == ("TURN_IN_PROGRESS", "pg-rej-a")
    assert await transcript(b, "pg-rej") == before
    first.task.cancel()


@pytest.mark.parametrize("strategy", [INTERRUPT, ROLLBACK], ids=["interrupt", "rollback"])
async def test_interrupt_and_rollback_stop_the_turn_on_the_other_replica(
    stubs: list[chat_service_pb2_grpc.ChatServiceStub], strategy: int
) -> None:
    a, b = stubs
    conv = f"pg-{strategy}"
    earlier = chat(a, conv, f"{conv}-0", "short")
    assert (await earlier.end()).status == event_pb2.TURN_STATUS_COMPLETED
    before = await transcript(a, conv)
    first = chat(a, conv, f"{conv}-a", "long")
    await wait_until(first.text_seen, timeout=15, what="text streams on replica A")
    await wait_until(lambda: has_reply(a, conv, f"tw-a-{conv}-a"), timeout=10, what="a checkpoint is stored")
    stopper = chat(b, conv, f"{conv}-b", "short", strategy)

    end = await first.end()
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    info = error_info(end.error)
    assert info.reason == ("INTERRUPTED" if strategy == INTERRUPT else "ROLLED_BACK")
    assert info.metadata["interrupting_request_id"] == f"{conv}-b"
    assert (await stopper.end()).status == event_pb2.TURN_STATUS_COMPLETED

    kept = [f"user:u-{conv}-a", f"assistant:tw-a-{conv}-a"] if strategy == INTERRUPT else []
    assert await transcript(b, conv) == [*before, *kept, f"user:u-{conv}-b", f"assistant:tw-a-{conv}-b"]


@pytest.mark.parametrize("strategy", [INTERRUPT, ROLLBACK], ids=["interrupt", "rollback"])
async def test_the_stopping_input_runs_before_the_turns_already_queued_on_both_replicas(
    stubs: list[chat_service_pb2_grpc.ChatServiceStub], pg_url: str, strategy: int
) -> None:
    """Two turns queued (ENQUEUE, one per replica) behind A's running turn; new input that stops
    it on replica B runs next, ahead of both, which then run in their order."""
    a, b = stubs
    conv = f"pg-order-{strategy}"
    first = chat(a, conv, f"{conv}-a", "long")
    await wait_until(first.text_seen, timeout=15, what="text streams on replica A")
    queue = StoreBackend("postgres", url=pg_url)
    try:
        q1 = chat(a, conv, f"{conv}-q1", "short")
        await wait_until(lambda: _tickets(queue, conv) == 2, timeout=10, what="q1 queued")
        q2 = chat(b, conv, f"{conv}-q2", "short")
        await wait_until(lambda: _tickets(queue, conv) == 3, timeout=10, what="q2 queued")
        stopper = chat(b, conv, f"{conv}-i", "short", strategy)

        assert (await first.end()).status == event_pb2.TURN_STATUS_ABORTED
        for turn in (stopper, q1, q2):
            assert (await turn.end()).status == event_pb2.TURN_STATUS_COMPLETED
    finally:
        await queue.close()
    kept = [f"user:u-{conv}-a", f"assistant:tw-a-{conv}-a"] if strategy == INTERRUPT else []
    assert await transcript(a, conv) == [
        *kept,
        *(f"{role}:{prefix}{conv}-{name}" for name in ("i", "q1", "q2") for role, prefix in _PAIR),
    ]


_PAIR = (("user", "u-"), ("assistant", "tw-a-"))


def _tickets(queue: StoreBackend, conversation_id: str) -> int:
    return int(
        queue.sql("SELECT COUNT(*) FROM turn_queue WHERE conversation_id = ?", (conversation_id,))[0][0]
    )
