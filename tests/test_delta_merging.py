"""Text deltas merged while the stream's writer is behind (issue 17), and resume around them.

engine/events.py: a delta whose block's previous delta has waited unread in the channel for a
turn of the event loop is appended to it instead of becoming an event of its own. Numbering
stays gap-free (docs/semantics.md §10), the stored stream holds the merged events exactly as
sent, so ResumeTurn from any sequence number, a merged delta's included, continues exactly
after it (§8); a reader that keeps up gets every delta as it came.
"""

from __future__ import annotations

import asyncio

from support.engine_harness import CONV, EngineFactory, collect, end_of, text_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2

WORDS = [f"w{i}" for i in range(300)]
TEXT = " ".join(WORDS)
# "burst": the deltas come a loop turn apart (a model's HTTP stream), faster than a slow writer.
BURST = {"burst": [ScriptStep(text=TEXT, delay_ms=0.1)], "paced": [ScriptStep(text=TEXT, delay_ms=1)]}


def deltas(events: list[event_pb2.TurnEvent]) -> list[event_pb2.TurnEvent]:
    return [e for e in events if e.WhichOneof("event") == "text_delta"]


def wire(events: list[event_pb2.TurnEvent]) -> list[bytes]:
    return [e.SerializeToString() for e in events]


async def test_unread_deltas_are_merged_gap_free_and_stored_as_sent(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=BURST)
    handle = await h.start("go", model="scripted:burst", request_id="r-merged")
    # Nobody reads until the turn is over: every delta after the first of a run finds its
    # predecessor unread a loop turn later.
    await wait_until(handle.task.done, what="the turn ends")
    events = await collect(handle)
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    merged = deltas(events)
    assert 0 < len(merged) < len(WORDS), "the burst was sent as fewer, merged deltas"
    streamed = "".join(e.text_delta.delta for e in merged)
    assert streamed == TEXT
    assert text_of((await h.store.load_messages(CONV))[-1]) == TEXT
    # The stored stream is what the caller was sent, byte for byte.
    assert wire([e async for e in h.engine.replay("r-merged", 0)]) == wire(events)


async def test_a_resume_after_a_merged_delta_continues_exactly_after_it(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=BURST)
    handle = await h.start("go", model="scripted:burst", request_id="r-resume")
    # A live reader attached from the start, which reads nothing until the turn is over either:
    # deltas merge only while both still hold them unread, so both get the same events.
    reader = h.engine.replay("r-resume", 0)
    first = await anext(reader)
    assert first.HasField("turn_start")
    await wait_until(handle.task.done, what="the turn ends")
    events = await collect(handle)
    assert wire([first, *[e async for e in reader]]) == wire(events)
    merged = [e for e in deltas(events) if len(e.text_delta.delta) > max(map(len, WORDS)) + 1]
    assert merged, "some deltas were merged"
    for event in (merged[0], merged[-1]):
        after = event.sequence_number
        resumed = [e async for e in h.engine.replay("r-resume", after)]
        assert wire(resumed) == wire(events[after:])
        before = [e async for e in h.engine.replay("r-resume", after - 1)]
        assert wire(before) == wire(events[after - 1 :])
        assert "".join(e.text_delta.delta for e in deltas(events[:after]) + deltas(resumed)) == TEXT


async def test_a_reader_that_keeps_up_gets_every_delta_as_it_came(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=BURST)
    reading = asyncio.ensure_future(collect(await h.start("go", model="scripted:paced")))
    events = await reading
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert len(deltas(events)) == len(WORDS)
    assert "".join(e.text_delta.delta for e in deltas(events)) == TEXT
