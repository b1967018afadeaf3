"""A remote ``on_chunk``'s ``OnChunks`` call (turnwire_server/remote_hooks/chunks.py
``ChunkStream``) when the turn is cancelled while it closes: the call is cancelled and its end
reported, whatever loop tick the cancel lands in; when the task that closes it is cancelled
before it starts, the buffered batches are still sent and the call ended (docs/semantics.md §4:
batches, one call per turn)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest
from support.waiting import wait_until

from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.remote_hooks.chunks import ChunkStream


class _UnansweredCall:
    """An ``OnChunks`` call whose server takes the requests (the first only once ``taken`` is
    set) and never answers."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.written: list[hooks_pb2.OnChunksRequest] = []
        self.taken = loop.create_future()
        self.cancelled = False
        self._answer: asyncio.Future[None] = loop.create_future()

    async def write(self, request: hooks_pb2.OnChunksRequest) -> None:
        self.written.append(request)
        if len(self.written) == 1:
            await self.taken

    async def done_writing(self) -> None:
        pass

    def cancel(self) -> None:
        self.cancelled = True
        self._answer.cancel()

    def __await__(self) -> Generator[Any, None, None]:
        return self._answer.__await__()


class _AnsweringCall(_UnansweredCall):
    """An ``OnChunks`` call whose server takes every request and answers once the client is done
    writing."""

    def __init__(self) -> None:
        super().__init__()
        self.taken.set_result(None)
        self.done = False

    async def done_writing(self) -> None:
        self.done = True
        self._answer.set_result(None)


def _stream(call: _UnansweredCall, ended: list[BaseException | None], buffer_events: int = 64) -> ChunkStream:
    """A stream on ``call`` sending batches of 4 events, each waiting up to a minute to fill."""
    return ChunkStream(
        lambda: call,
        hooks_pb2.TurnInfo(request_id="r1"),
        server="s",
        max_events=4,
        max_delay_ms=60_000,
        buffer_events=buffer_events,
        deadline_seconds=30,
        on_result=ended.append,
    )


def _add_deltas(stream: ChunkStream, count: int) -> None:
    for n in range(count):
        event = event_pb2.TurnEvent()
        event.text_delta.delta = f"w{n}"
        stream.add(0, event)


async def test_a_close_cancelled_before_it_starts_still_sends_the_batches_and_ends_the_call() -> None:
    """The task that closes the stream (an evicted stream's, a closing middleware's) is cancelled
    before it first runs: the stream is ended all the same, its buffered events sent and the
    call ended and answered, instead of the sender waiting forever with the call open."""
    call = _AnsweringCall()
    ended: list[BaseException | None] = []
    stream = _stream(call, ended)
    _add_deltas(stream, 5)  # a full batch of 4 (the step_start and 3 deltas), then 2 more events
    closing = asyncio.create_task(stream.close())
    closing.cancel()  # before it first ran
    with pytest.raises(asyncio.CancelledError):
        await closing
    await wait_until(lambda: ended, what="the call's end is reported")
    assert ended == [None] and call.done and not call.cancelled
    assert [len(request.events) for request in call.written] == [4, 2]


async def test_a_stream_closed_with_a_full_buffer_ends_its_call_once_sent() -> None:
    """No room is left in the buffer for the stream's end: the call ends all the same once the
    buffered events are sent, instead of waiting out the deadline."""
    call = _AnsweringCall()
    ended: list[BaseException | None] = []
    stream = _stream(call, ended, buffer_events=3)
    _add_deltas(stream, 2)  # the step_start and 2 deltas: the buffer is full
    await stream.close()
    assert ended == [None] and call.done
    assert [len(request.events) for request in call.written] == [3]


@pytest.mark.parametrize("ticks", [0, 1, 2, 3])
async def test_a_turn_cancelled_as_it_closes_cancels_its_call(ticks: int) -> None:
    # The first batch is being written when close() queues the end and wakes the sender; the
    # turn is cancelled ``ticks`` loop ticks after the server takes that batch. The sender then
    # waits for a batch that close() already woke: a cancel landing as that wait ends must stay
    # a cancel (Python 3.11's wait_for returned there as if not cancelled, so the sender sent on
    # and hung on the unanswered call, never cancelling it nor reporting its end).
    call = _UnansweredCall()
    ended: list[BaseException | None] = []
    stream = _stream(call, ended)
    _add_deltas(stream, 5)  # a full batch of 4 (the step_start and 3 deltas), then 2 more events
    await wait_until(lambda: len(call.written) == 1, what="the first batch is being written")
    closing = asyncio.create_task(stream.close())
    await asyncio.sleep(0)  # a loop tick: close() queues the end and waits for the sender
    call.taken.set_result(None)
    for _ in range(ticks):
        await asyncio.sleep(0)  # a loop tick, not a wait for time
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await wait_until(lambda: ended, what="the call's end is reported")
    assert call.cancelled, "the unanswered call was cancelled"
    assert len(ended) == 1 and isinstance(ended[0], TimeoutError)
