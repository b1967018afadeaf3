"""``stream_turn`` sending event batches (docs/semantics.md §10, "Event batches") with Progress
keepalives (§8, liveness): a keepalive that a batch swallows (queued behind turn events) does not
stop the later ones, and the phase a keepalive reports follows every event of a batch, not only
its last. Driven through a turn channel fed by hand, with no engine and no server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from support.waiting import wait_until

from turnwire_client.metadata import EVENT_BATCHES_METADATA
from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.api.turn_streams import stream_turn
from turnwire_server.engine import TurnHandle
from turnwire_server.engine.channel import EventChannel

INTERVAL = 0.05  # seconds of silence before a keepalive


class _Handle(TurnHandle):
    """A started turn whose events the test puts into its channel."""

    def __init__(self) -> None:  # no engine: only what stream_turn reads
        self.channel: EventChannel[Any] = EventChannel()
        self.run = SimpleNamespace(request=SimpleNamespace(response_type=chat_service_pb2.ChatResponse))  # type: ignore[assignment]
        self.request_id = "r"
        self.conversation_id = "c"

    def release(self) -> None:
        self.channel.close()


class _Context:
    """The part of a servicer context stream_turn reads: a caller that asks for batches."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((EVENT_BATCHES_METADATA, "1"),)

    async def abort_with_status(self, status: Any) -> None:
        raise AssertionError(f"aborted: {status}")


def _response(kind: str, number: int, **fields: object) -> chat_service_pb2.ChatResponse:
    response = chat_service_pb2.ChatResponse()
    event = response.event
    event.conversation_id, event.request_id, event.sequence_number = "c", "r", number
    getattr(event, kind).SetInParent()
    for name, value in fields.items():
        setattr(getattr(event, kind), name, value)
    return response


def _events(response: chat_service_pb2.ChatResponse) -> list[event_pb2.TurnEvent]:
    return [response.event, *response.more_events]


async def _stream(handle: _Handle) -> AsyncIterator[chat_service_pb2.ChatResponse]:
    async def start() -> TurnHandle:
        return handle

    return stream_turn(_Context(), start, INTERVAL)


async def _next(stream: AsyncIterator[chat_service_pb2.ChatResponse]) -> chat_service_pb2.ChatResponse:
    return await asyncio.wait_for(anext(stream), 10)


async def test_a_keepalive_dropped_in_a_batch_does_not_stop_the_later_ones() -> None:
    handle = _Handle()
    stream = await _stream(handle)
    handle.channel.put(_response("turn_start", 1))
    assert _events(await _next(stream))[0].HasField("turn_start")
    delta = _response("text_delta", 2, delta="hi")
    handle.channel.put(delta)
    # The caller reads nothing for a while: a keepalive is queued behind the delta.
    await wait_until(lambda: handle.channel.last_unread() is not delta, what="a queued keepalive")
    batched = await _next(stream)
    assert [event.sequence_number for event in _events(batched)] == [2]  # the keepalive dropped
    # The turn goes silent now: a keepalive follows (before the fix, none ever came again).
    later = await _next(stream)
    assert later.event.HasField("progress"), later
    handle.channel.close()


async def test_a_keepalive_reports_what_every_event_of_a_batch_started() -> None:
    handle = _Handle()
    stream = await _stream(handle)
    handle.channel.put(_response("turn_start", 1))
    await _next(stream)
    # Two tool calls start at once (one message), then the second one's result comes.
    handle.channel.put(_response("tool_input_available", 2, tool_call_id="a"))
    handle.channel.put(_response("tool_input_available", 3, tool_call_id="b"))
    assert [event.sequence_number for event in _events(await _next(stream))] == [2, 3]
    handle.channel.put(_response("tool_output_available", 4, tool_call_id="b"))
    await _next(stream)
    progress = await _next(stream)
    assert progress.event.HasField("progress"), progress
    assert progress.event.progress.phase == event_pb2.PROGRESS_PHASE_TOOL  # "a" still runs
    handle.channel.close()


async def test_a_batch_stays_within_the_bytes_given() -> None:
    """A batch holds at most the bytes ChatService gives ``stream_turn``; one larger event alone."""
    handle = _Handle()

    async def start() -> TurnHandle:
        return handle

    stream = stream_turn(_Context(), start, 0.0, 2048)
    handle.channel.put(_response("turn_start", 1))
    await _next(stream)
    for number in range(2, 8):  # six deltas of ~1,000 bytes, ready at once
        handle.channel.put(_response("text_delta", number, delta="x" * 1000))
    handle.channel.put(_response("text_delta", 8, delta="y" * 3000))  # over the bytes: alone
    handle.channel.close()
    sent = [response async for response in stream]
    assert [event.sequence_number for response in sent for event in _events(response)] == list(range(2, 9))
    assert all(sum(event.ByteSize() for event in _events(r)) <= 2048 for r in sent[:-1])
    assert [len(_events(r)) for r in sent] == [2, 2, 2, 1]
