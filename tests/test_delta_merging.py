"""Text deltas merged while the stream's writer is behind (issue 17), and resume around them.

engine/events.py: a delta whose block's previous delta is still unread in the channel is appended
to it instead of becoming an event of its own. Numbering
stays gap-free (docs/semantics.md §10), the stored stream holds the merged events exactly as
sent, so ResumeTurn from any sequence number, a merged delta's included, continues exactly
after it (§8); a reader that keeps up gets every delta as it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from support.engine_harness import CONV, EngineFactory, collect, end_of, text_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.events import EventWriter

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
    assert wire([e async for batch in h.engine.replay("r-merged", 0) for e in batch]) == wire(events)


async def test_a_resume_after_a_merged_delta_continues_exactly_after_it(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=BURST)
    handle = await h.start("go", model="scripted:burst", request_id="r-resume")
    # A live reader attached from the start, which reads nothing until the turn is over either:
    # deltas merge only while both still hold them unread, so both get the same events.
    reader = h.engine.replay("r-resume", 0)
    first, *more = await anext(reader)
    assert first.HasField("turn_start")
    await wait_until(handle.task.done, what="the turn ends")
    events = await collect(handle)
    assert wire([first, *more, *[e async for batch in reader for e in batch]]) == wire(events)
    merged = [e for e in deltas(events) if len(e.text_delta.delta) > max(map(len, WORDS)) + 1]
    assert merged, "some deltas were merged"
    for event in (merged[0], merged[-1]):
        after = event.sequence_number
        resumed = [e async for batch in h.engine.replay("r-resume", after) for e in batch]
        assert wire(resumed) == wire(events[after:])
        before = [e async for batch in h.engine.replay("r-resume", after - 1) for e in batch]
        assert wire(before) == wire(events[after - 1 :])
        assert "".join(e.text_delta.delta for e in deltas(events[:after]) + deltas(resumed)) == TEXT


async def test_a_reader_that_keeps_up_gets_every_delta_as_it_came(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=BURST)
    reading = asyncio.ensure_future(collect(await h.start("go", model="scripted:paced")))
    events = await reading
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert len(deltas(events)) == len(WORDS)
    assert "".join(e.text_delta.delta for e in deltas(events)) == TEXT


async def _sent(
    writer: EventWriter, reader: AsyncIterator[chat_service_pb2.ChatResponse] | None = None
) -> list[tuple[int, str, str]]:
    """What ``reader`` (default: a new one of the writer's channel) reads once the writer closes:
    (sequence number, event kind, delta or block id) each."""
    writer.close()
    out = []
    async for response in reader or aiter(writer.channel):
        event = response.event
        kind = event.WhichOneof("event") or ""
        payload = getattr(event, kind)
        out.append((event.sequence_number, kind, payload.delta if kind.endswith("_delta") else payload.id))
    return out


async def test_unread_deltas_of_a_block_merge_in_one_loop_turn_and_across_turns() -> None:
    # Issue 33: deltas the server read in one piece (sent in one loop turn) merge too, as do those
    # a writer is behind on; another block or kind, or an event in between, keeps them apart
    # (docs/semantics.md §10). Before, deltas sent in one turn stayed apart: a burst of 64 cost
    # 64 gRPC messages.
    channel: EventChannel[chat_service_pb2.ChatResponse] = EventChannel()
    writer = EventWriter("c", "r", chat_service_pb2.ChatResponse, channel)
    writer.new().text_start.id = "a"
    for delta in ("1", "2", "3"):
        writer.text_delta("a", delta)
    await asyncio.sleep(0)  # a loop turn: "123" still unread
    writer.text_delta("a", "4")
    writer.text_delta("a", "5")
    writer.new().text_end.id = "a"
    writer.new().reasoning_start.id = "b"
    writer.reasoning_delta("b", "6")
    writer.reasoning_delta("b", "7")
    await asyncio.sleep(0)
    writer.reasoning_delta("b", "8")
    await asyncio.sleep(0)
    writer.text_delta("b", "9")  # another kind than the waiting delta: apart
    assert await _sent(writer) == [
        (1, "text_start", "a"),
        (2, "text_delta", "12345"),
        (3, "text_end", "a"),
        (4, "reasoning_start", "b"),
        (5, "reasoning_delta", "678"),
        (6, "text_delta", "9"),
    ]


async def test_a_delta_sent_after_its_predecessor_was_read_is_not_merged() -> None:
    channel: EventChannel[chat_service_pb2.ChatResponse] = EventChannel()
    writer = EventWriter("c", "r", chat_service_pb2.ChatResponse, channel)
    reader = aiter(channel)
    writer.text_delta("a", "1")
    await asyncio.sleep(0)
    taken = await anext(reader)  # read: the writer keeps up
    writer.text_delta("a", "2")
    await asyncio.sleep(0)
    writer.text_delta("a", "3")  # "2" waited a turn unread: merged
    assert taken.event.text_delta.delta == "1"
    assert await _sent(writer, reader) == [(2, "text_delta", "23")]
