"""Fencing in the engine, on SQLite (docs/semantics.md §5, "Fencing"): two engines on one store
stand for two replicas. Replica B claims a turn replica A still runs (A stalled past its lease);
when A goes on, the store refuses its first write, so A stops the turn, stores nothing more and
tells its caller ``LEASE_LOST`` (``ABORTED``, with a retry hint); B's recovery completes the turn
once, and the stored stream holds B's attempt only.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from google.rpc import error_details_pb2
from support.engine_harness import EngineFactory, Harness, collect, detail, end_of, engine_settings, text_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import TurnEngine
from turnwire_server.providers.registry import ProviderRegistry

SCRIPTS = {"main": [ScriptStep(text="the whole answer, word by word", delay_ms=2, repeat=True)]}


def replica_b(a: Harness, *, checkpoint_interval_ms: int) -> TurnEngine:
    """A second engine on ``a``'s store, provider and chain: replica B."""
    return TurnEngine(
        store=a.store,
        providers=ProviderRegistry({"scripted": a.provider}),
        tools={},
        chain=a.chain,
        settings=engine_settings(checkpoint_interval_ms=checkpoint_interval_ms, replica_id="replica-b"),
        error_status=status_of,
    )


async def test_a_replica_whose_turn_was_taken_over_writes_nothing_more(make_engine: EngineFactory) -> None:
    a = await make_engine(scripts=SCRIPTS, checkpoint_interval_ms=5, replica_id="replica-a")
    b = replica_b(a, checkpoint_interval_ms=5)
    stalled = asyncio.Event()

    async def stall_first_call(request: Any) -> None:
        if a.provider.calls == 1:  # A's call: held as a paused process would be
            await stalled.wait()

    a.provider.before_stream = stall_first_call
    handle = await a.start("question", request_id="r1")
    caller = asyncio.ensure_future(collect(handle))
    await wait_until(
        lambda: handle.run.messages_persisted and a.provider.calls == 1, what="A calls the model"
    )

    assert await b.recover() == 1, "B takes the turn over"
    (claimed,) = [t for t in [await a.store.get_turn("r1")] if t is not None]
    assert (claimed.owner, claimed.lease_epoch) == ("replica-b", 1)

    stalled.set()  # A goes on, unaware
    events = await asyncio.wait_for(caller, 10)
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_INTERRUPTED
    assert end.error.code == 10  # ABORTED: re-attach (ResumeTurn), never resend
    info = detail(end.error, error_details_pb2.ErrorInfo)
    assert info.reason == "LEASE_LOST" and info.metadata["request_id"] == "r1"
    assert detail(end.error, error_details_pb2.RetryInfo) is not None
    assert "ResumeTurn" in end.error.message

    # B's recovery (queued behind A's turn in this one process) completes the turn, once.
    await wait_until(lambda: b.running == 0 and a.provider.calls == 2, timeout=10, what="B's recovery ends")
    record = await a.store.get_turn("r1")
    assert record is not None and (record.state, record.owner, record.recovery_count) == (
        "completed",
        "replica-b",
        1,
    )
    messages = await a.store.load_messages("conv-1")
    assert [m.id for m in messages] == ["u1", claimed.assistant_message_id], "one stored answer"
    assert text_of(messages[1]) == "the whole answer, word by word"
    stored = [event_pb2.TurnEvent.FromString(e) for e in await a.store.load_events("r1", 0)]
    kinds = [e.WhichOneof("event") for e in stored]
    # A's TurnStart is stored when its batch committed before the claim (else it is lost as a
    # crash loses unstored events: a reader gets B's AttemptStart first).
    assert kinds.count("turn_start") <= 1 and kinds.count("attempt_start") == 1
    assert kinds.count("turn_end") == 1 and stored[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    before_b = kinds[: kinds.index("attempt_start")]
    assert "text_delta" not in before_b, "nothing A streamed after the takeover was stored"
    await b.drain(1.0)


async def test_a_turn_taken_over_as_it_finishes_ends_lease_lost_at_once(make_engine: EngineFactory) -> None:
    """The takeover lands between A's last stored write and its final write: the store refuses
    the final write (``LeaseLost``), and A's caller is told so at once, not after the final
    write's patience for a store outage (``durability.store_outage_seconds``): a lost lease does
    not come back, so that write is not retried (chaos probe: a sender waited out the minute)."""
    a = await make_engine(
        scripts={"main": [ScriptStep(text="a short answer")]},
        checkpoint_interval_ms=60_000,
        replica_id="replica-a",
        store_outage_seconds=20,
    )
    b = replica_b(a, checkpoint_interval_ms=60_000)
    finish_turn = a.store.finish_turn
    attempts: list[str] = []

    async def taken_over_first(record: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(record.owner)
        if len(attempts) == 1:  # A's final write: B claims the turn just before it lands
            # (in a context of its own: from A's task, B's recovery would be a nested turn)
            claim = asyncio.get_running_loop().create_task(b.recover(), context=contextvars.Context())
            assert await claim == 1
        return await finish_turn(record, *args, **kwargs)

    a.store.finish_turn = taken_over_first  # type: ignore[method-assign,assignment]
    handle = await a.start("question", request_id="r1")
    events = await asyncio.wait_for(collect(handle), 10)
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_INTERRUPTED
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "LEASE_LOST"
    assert attempts[:2] == ["replica-a", "replica-b"], "A's refused final write was not tried again"

    await wait_until(lambda: b.running == 0 and a.provider.calls == 2, timeout=10, what="B's recovery ends")
    record = await a.store.get_turn("r1")
    assert record is not None and (record.state, record.owner) == ("completed", "replica-b")
    await b.drain(1.0)
