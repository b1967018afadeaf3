"""The stream log and re-attaching (engine level): exactly once across the store, the in-memory
backlog and live events; a reader that falls behind re-attaches (docs/semantics.md §8)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.engine_harness import EngineFactory, collect, end_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.errors import TurnNotFound

WORDS = [f"w{i}" for i in range(120)]
SLOW = {"slow": [ScriptStep(text=" ".join(WORDS), delay_ms=2)]}


async def test_a_reader_that_falls_behind_reattaches_and_misses_nothing(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="turnwire.stream_log")
    h = await make_engine(scripts=SLOW, stream_buffer_events=16, checkpoint_interval_ms=20)
    handle = h.start("go", model="scripted:slow", request_id="r-behind")
    caller = asyncio.ensure_future(collect(handle))
    reader = h.engine.replay("r-behind", 0)
    first = await anext(reader)  # attached
    assert first.HasField("turn_start")
    # The reader stops reading while the turn runs on: far more than 16 events pass it.
    await wait_until(
        lambda: handle.log.last_sequence_number > first.sequence_number + 60, what="the turn runs on"
    )
    rest = [event async for event in reader]
    events = [first, *rest]
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    assert [e.SerializeToString() for e in events] == [e.SerializeToString() for e in await caller]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert "re-attaches" in caplog.text, "the reader was dropped once and re-attached"


async def test_a_finished_turn_is_read_from_the_store_and_an_unstarted_one_is_not_found(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=SLOW)
    events = await collect(h.start("go", model="scripted:slow", request_id="r-done"))
    await wait_until(lambda: h.engine.handle("r-done") is None, what="the turn's events are stored")
    again = [event async for event in h.engine.replay("r-done", 0)]
    assert [e.SerializeToString() for e in again] == [e.SerializeToString() for e in events]
    tail = [event async for event in h.engine.replay("r-done", len(events) - 2)]
    assert [e.sequence_number for e in tail] == [len(events) - 1, len(events)]
    # ContinueLastTurn on an empty conversation ends SKIPPED before any input is stored.
    skipped = await collect(
        h.start(None, conversation_id="empty", continuation=True, request_id="r-skip", model="scripted:slow")
    )
    assert end_of(skipped).status == event_pb2.TURN_STATUS_SKIPPED
    await wait_until(lambda: h.engine.handle("r-skip") is None, what="the skipped turn is gone")
    with pytest.raises(TurnNotFound, match="never started"):
        async for _ in h.engine.replay("r-skip", 0):
            pass
