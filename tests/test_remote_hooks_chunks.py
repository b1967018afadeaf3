"""A remote ``on_chunk``'s ``OnChunks`` call (turnwire_server/remote_hooks/chunks.py
``ChunkStream``) when the turn is cancelled while it closes: the call is cancelled and its end
reported, whatever loop tick the cancel lands in (docs/semantics.md §4: batches, one call per
turn)."""

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


@pytest.mark.parametrize("ticks", [0, 1, 2, 3])
async def test_a_turn_cancelled_as_it_closes_cancels_its_call(ticks: int) -> None:
    # The first batch is being written when close() queues the end and wakes the sender; the
    # turn is cancelled ``ticks`` loop ticks after the server takes that batch. The sender then
    # waits for a batch that close() already woke: a cancel landing as that wait ends must stay
    # a cancel (Python 3.11's wait_for returned there as if not cancelled, so the sender sent on
    # and hung on the unanswered call, never cancelling it nor reporting its end).
    call = _UnansweredCall()
    ended: list[BaseException | None] = []
    stream = ChunkStream(
        lambda: call,
        hooks_pb2.TurnInfo(request_id="r1"),
        server="s",
        max_events=4,
        max_delay_ms=60_000,
        buffer_events=64,
        deadline_seconds=30,
        on_result=ended.append,
    )
    for n in range(5):  # a full batch of 4 (the step_start and 3 deltas), then 2 more events
        event = event_pb2.TurnEvent()
        event.text_delta.delta = f"w{n}"
        stream.add(0, event)
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
