"""Durable turns at engine level: re-attaching (exactly once across the store, the in-memory
backlog and live events; a reader that falls behind re-attaches), bounded crash recoveries and
turn leases (docs/semantics.md §8)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from support.engine_harness import EngineFactory, collect, end_of, text_of
from support.store_turns import crashed_turn
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.errors import TurnStreamNotFound
from turnwire_server.engine.replica import Replica
from turnwire_server.store.sqlite import SqliteStore

WORDS = [f"w{i}" for i in range(120)]
SLOW = {"slow": [ScriptStep(text=" ".join(WORDS), delay_ms=2)]}


async def test_a_reader_that_falls_behind_reattaches_and_misses_nothing(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="turnwire.stream_log")
    h = await make_engine(scripts=SLOW, stream_buffer_events=16, checkpoint_interval_ms=20)
    handle = await h.start("go", model="scripted:slow", request_id="r-behind")
    caller = asyncio.ensure_future(collect(handle))
    reader = h.engine.replay("r-behind", 0)
    (first,) = await anext(reader)  # attached (one event a list: no batches asked for)
    assert first.HasField("turn_start")
    # The reader stops reading while the turn runs on: far more than 16 events pass it.
    await wait_until(
        lambda: handle.log.last_sequence_number > first.sequence_number + 60, what="the turn runs on"
    )
    rest = [event async for batch in reader for event in batch]
    events = [first, *rest]
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    assert [e.SerializeToString() for e in events] == [e.SerializeToString() for e in await caller]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert "re-attaches" in caplog.text, "the reader was dropped once and re-attached"


async def test_a_finished_turn_is_read_from_the_store_and_an_unstarted_one_is_not_found(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=SLOW)
    events = await collect(await h.start("go", model="scripted:slow", request_id="r-done"))
    await wait_until(lambda: h.engine.handle("r-done") is None, what="the turn's events are stored")
    again = [event async for batch in h.engine.replay("r-done", 0) for event in batch]
    assert [e.SerializeToString() for e in again] == [e.SerializeToString() for e in events]
    tail = [event async for batch in h.engine.replay("r-done", len(events) - 2) for event in batch]
    assert [e.sequence_number for e in tail] == [len(events) - 1, len(events)]
    # ContinueLastTurn on an empty conversation ends SKIPPED before any input is stored.
    skipped = await collect(
        await h.start(
            None, conversation_id="empty", continuation=True, request_id="r-skip", model="scripted:slow"
        )
    )
    assert end_of(skipped).status == event_pb2.TURN_STATUS_SKIPPED
    await wait_until(lambda: h.engine.handle("r-skip") is None, what="the skipped turn is gone")
    with pytest.raises(TurnStreamNotFound, match="never started"):
        async for _ in h.engine.replay("r-skip", 0):
            pass


async def test_a_replay_gives_the_events_ready_at_once_in_lists_within_the_limits(
    make_engine: EngineFactory,
) -> None:
    """Event batches on a re-attached stream (docs/semantics.md §10): from the store, and live
    (the backlog and the channel), every event once and in order, at most the limits a list."""
    h = await make_engine(scripts=SLOW, checkpoint_interval_ms=20)
    handle = await h.start("go", model="scripted:slow", request_id="r-lists")
    live = [batch async for batch in h.engine.replay("r-lists", 0, batch_events=8, batch_bytes=1 << 20)]
    events = await collect(handle)
    wire = [e.SerializeToString() for e in events]
    assert [e.SerializeToString() for batch in live for e in batch] == wire
    assert max(map(len, live)) <= 8
    await wait_until(lambda: h.engine.handle("r-lists") is None, what="the turn's events are stored")
    stored = [batch async for batch in h.engine.replay("r-lists", 3, batch_events=8, batch_bytes=1 << 20)]
    assert [e.SerializeToString() for batch in stored for e in batch] == wire[3:]
    assert [len(batch) for batch in stored[:-1]] == [8] * (len(stored) - 1), "read together: full lists"
    # Past its first event, a list holds no more bytes than allowed: here one event each.
    small = [batch async for batch in h.engine.replay("r-lists", 0, batch_events=8, batch_bytes=1)]
    assert [len(batch) for batch in small] == [1] * len(events)


async def test_recoveries_at_start_are_bounded_and_each_finishes_its_answer(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """docs/semantics.md §8: turns a crash left running are recovered at start, at most
    ``max_concurrent_recoveries`` calling the model at once; each continues its own stored reply."""
    crashed = SqliteStore(tmp_path / "turnwire.db")
    await crashed.open()
    for n in range(5):
        record = await crashed_turn(crashed, f"c{n}", f"r-crash-{n}", model="scripted:slow", text="tell me")
        partial = message_pb2.Message(id=record.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
        partial.parts.add().text.text = "once upon"
        await crashed.save_message(record.conversation_id, partial)
    await crashed.close()

    h = await make_engine(scripts=SLOW, max_concurrent_recoveries=2)
    in_flight = peak = 0
    release = asyncio.Event()

    async def hold(request: Any) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1

    h.provider.before_stream = hold
    assert await h.engine.recover() == 5
    await wait_until(lambda: in_flight == 2, what="two recoveries call the model")
    for _ in range(100):  # every other recovery task gets its turn to run meanwhile
        await asyncio.sleep(0)
    assert (in_flight, h.provider.calls) == (2, 2), "the other three wait for a slot"
    release.set()
    await wait_until(lambda: h.engine.running == 0, timeout=20, what="every recovery ends")
    assert peak == 2
    for n in range(5):
        messages = await h.store.load_messages(f"c{n}")
        assert [m.id for m in messages] == [f"u-r-crash-{n}", f"tw-a-r-crash-{n}"], "one stored answer each"
        assert text_of(messages[1]).startswith("once upon") and len(text_of(messages[1])) > len("once upon")


async def test_the_lease_keeper_renews_the_leases_of_running_turns(make_engine: EngineFactory) -> None:
    """A replica renews its turns' leases in one batch per tick (docs/semantics.md §8)."""
    h = await make_engine(scripts=SLOW, lease_seconds=30)
    handle = await h.start("go", model="scripted:slow", request_id="r-lease")
    caller = asyncio.ensure_future(collect(handle))
    await wait_until(lambda: handle.run.messages_persisted, what="the turn is recorded")
    (before,) = await h.store.running_turns()
    assert before.owner == h.engine.settings.replica_id and before.lease_until is not None
    keeper = Replica(h.engine, resume=True)
    assert await keeper.tick() == 0, "nothing to take over: the only running turn is ours"
    (after,) = await h.store.running_turns()
    assert after.lease_until is not None and after.lease_until > before.lease_until
    await caller
