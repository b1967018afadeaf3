"""Backpressure: a client that stops reading holds a bounded backlog, and its turn is stopped.

docs/semantics.md §5 (backpressure): past ``stream_buffer_events`` unread events the turn
waits for the client; a client that brings the backlog down by nothing for
``slow_reader_timeout_seconds`` has its turn stopped, its partial reply stored and the
terminal event says ``SLOW_CONSUMER``.
"""

from __future__ import annotations

import dataclasses

from google.rpc import error_details_pb2
from support.engine_harness import CONV, EngineFactory, collect, detail, end_of, text_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.errors import SlowConsumer

WORDS = 5_000
LONG_REPLY = {"main": [ScriptStep(text=" ".join(f"w{i}" for i in range(WORDS)))]}


async def test_a_stuck_reader_holds_a_bounded_backlog_and_its_turn_is_stopped(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=LONG_REPLY, stream_buffer_events=64, slow_reader_timeout_seconds=0.3)
    handle = await h.start("go")
    largest = 0

    def turn_over() -> bool:
        nonlocal largest
        largest = max(largest, len(handle.channel._items))
        return handle.task.done()

    # Nobody reads the stream: the turn must neither buffer the whole reply nor wait forever.
    await wait_until(turn_over, timeout=10, what="the turn of a stuck reader ends")
    assert largest <= 64 + 8  # the bound plus the terminal events, never the 5,000 deltas
    events = await collect(handle)
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "SLOW_CONSUMER"
    stored = (await h.store.load_messages(CONV))[-1]
    # The partial reply is stored and is exactly what was produced before the stop.
    streamed = "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")
    assert text_of(stored) == streamed and 0 < len(streamed.split()) < WORDS
    assert end.message.id == stored.id


async def test_a_reader_that_keeps_up_gets_every_event(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=LONG_REPLY, stream_buffer_events=64, slow_reader_timeout_seconds=0.3)
    events = await collect(await h.start("go"))
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    streamed = "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")
    assert len(streamed.split()) == WORDS


async def test_a_stuck_reader_of_a_continue_turn_is_let_go_and_the_turn_finishes(
    make_engine: EngineFactory,
) -> None:
    """With disconnect policy CONTINUE the stuck reader is let go instead: its channel ends with
    the reason (the API ends the call RESOURCE_EXHAUSTED, SLOW_CONSUMER, naming where to
    re-attach), the turn finishes, and ResumeTurn has every event (docs/semantics.md §5)."""
    h = await make_engine(scripts=LONG_REPLY, stream_buffer_events=64, slow_reader_timeout_seconds=0.3)
    request = dataclasses.replace(h.request("go", request_id="r-go"), disconnect="continue")
    handle = await h.engine.start(request)
    await wait_until(handle.task.done, timeout=10, what="the turn finishes without its reader")
    assert isinstance(handle.channel.detached_by, SlowConsumer)
    assert [response async for response in handle.channel] == [], "the let-go reader gets nothing more"
    events = [event async for batch in h.engine.replay("r-go", 0) for event in batch]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    streamed = "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")
    assert len(streamed.split()) == WORDS
