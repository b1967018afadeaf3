"""A remote ``on_chunk``: each turn's chunks as ``TurnEvent`` batches on one ``OnChunks`` call.

docs/semantics.md §4: chunks reach a remote hook in batches, never one RPC per token.
:func:`chunk_event` turns a chunk (a ``turnwire.types`` model chunk or a tool result part) into
the event a client would see; :class:`ChunkStream` buffers a turn's events (bounded: when full,
events are dropped and counted rather than slowing the turn) and sends them on one
client-streaming call, a request per ``max_events`` events or ``max_delay_ms`` after a batch's
first event, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from turnwire.types import (
    File,
    FinishStep,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    Source,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputDelta,
    ToolInputStart,
)
from turnwire.values import dumps
from turnwire_client.v1 import event_pb2, hooks_pb2, message_pb2
from turnwire_server.event_waits import set_within
from turnwire_server.remote_hooks import metrics
from turnwire_server.remote_hooks.convert import step_finish_reason

log = logging.getLogger("turnwire.middleware")


def chunk_event(chunk: Any) -> event_pb2.TurnEvent | None:
    """The ``TurnEvent`` for one ``ChunkContext.chunk``; None for chunks clients never see
    (usage updates)."""
    event = event_pb2.TurnEvent()
    kind = type(chunk)
    if kind is TextDelta:
        event.text_delta.id = chunk.id
        event.text_delta.delta = chunk.delta
    elif kind is ReasoningDelta:
        event.reasoning_delta.id = chunk.id
        event.reasoning_delta.delta = chunk.delta
    elif kind is TextStart:
        event.text_start.id = chunk.id
    elif kind is TextEnd:
        event.text_end.id = chunk.id
    elif kind is ReasoningStart:
        event.reasoning_start.id = chunk.id
    elif kind is ReasoningEnd:
        event.reasoning_end.id = chunk.id
    elif kind is ToolInputStart:
        event.tool_input_start.tool_call_id = chunk.tool_call_id
        event.tool_input_start.tool_name = chunk.tool_name
    elif kind is ToolInputDelta:
        event.tool_input_delta.tool_call_id = chunk.tool_call_id
        event.tool_input_delta.input_text_delta = chunk.delta
    elif kind is ToolCall:
        if chunk.error is not None or chunk.input is None:
            error = event.tool_input_error
            error.tool_call_id, error.tool_name = chunk.tool_call_id, chunk.tool_name
            error.raw_input, error.error_text = chunk.raw_input, chunk.error or ""
        else:
            available = event.tool_input_available
            available.tool_call_id, available.tool_name = chunk.tool_call_id, chunk.tool_name
            available.input_json = chunk.raw_input or dumps(chunk.input)
    elif kind is Source:
        chunk.copy_to(event.source)
    elif kind is File:
        chunk.copy_to(event.file)
    elif kind is FinishStep:
        finish = event.step_finish
        finish.finish_reason = step_finish_reason(chunk.finish_reason)
        finish.raw_finish_reason = chunk.raw_finish_reason
        chunk.usage.copy_to(finish.usage)
        finish.response_id, finish.response_model = chunk.response_id, chunk.response_model
    elif isinstance(chunk, message_pb2.ToolCallPart):
        _tool_result(chunk, event)
    else:
        return None
    return event


def _tool_result(part: message_pb2.ToolCallPart, event: event_pb2.TurnEvent) -> None:
    if part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
        event.tool_output_error.tool_call_id = part.tool_call_id
        event.tool_output_error.tool_name = part.tool_name
        event.tool_output_error.error_text = part.error_text
    elif part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
        event.tool_output_denied.tool_call_id = part.tool_call_id
        event.tool_output_denied.tool_name = part.tool_name
        event.tool_output_denied.reason = part.error_text
    else:
        available = event.tool_output_available
        available.tool_call_id = part.tool_call_id
        available.tool_name = part.tool_name
        available.output_json = part.output_json
        available.preliminary = part.preliminary


_END = object()

OpenCall = Callable[[], Any]
"""Opens the turn's ``OnChunks`` call (a ``grpc.aio.StreamUnaryCall``)."""


class ChunkStream:
    """One turn's ``OnChunks`` call: a bounded buffer and a task that sends it in batches.

    ``open_call`` opens the call (with its metadata); ``info`` goes in the first request;
    ``on_result(error)`` gets the call's end (None: the server answered) so the caller can
    count it and feed its breaker. :meth:`add` never blocks; :meth:`end` has the sender flush
    and end the call, its answer awaited at most ``deadline_seconds`` from then; :meth:`close`
    ends it and waits for that, robust to a cancel.
    """

    def __init__(
        self,
        open_call: OpenCall,
        info: hooks_pb2.TurnInfo,
        *,
        server: str,
        max_events: int,
        max_delay_ms: float,
        buffer_events: int,
        deadline_seconds: float,
        on_result: Callable[[BaseException | None], None],
    ) -> None:
        self._open_call = open_call
        self._info = info
        self._server = server
        self._max_events = max_events
        self._max_delay = max_delay_ms / 1000.0
        self._deadline = deadline_seconds
        self._queue: asyncio.Queue[Any] = asyncio.Queue(buffer_events)
        self._full = asyncio.Event()
        self._on_result = on_result
        self._failed = False
        self._step = -1
        self._expiry: asyncio.TimerHandle | None = None  # the deadline armed by close()
        self.sent_events = 0
        self.sent_batches = 0
        self._task = asyncio.create_task(self._send(), name=f"OnChunks {info.request_id}")

    def add(self, step_number: int, event: event_pb2.TurnEvent) -> None:
        """Queue ``event`` (a ``step_start`` first when ``step_number`` is new); drops it when
        the buffer is full or the call failed."""
        if step_number != self._step:
            self._step = step_number
            start = event_pb2.TurnEvent()
            start.step_start.step_number = step_number
            self._put(start)
        self._put(event)

    def _put(self, event: event_pb2.TurnEvent) -> None:
        if self._failed or self._expiry is not None:  # failed, or ended: nothing more is sent
            metrics.CHUNK_EVENTS.labels(self._server, "dropped").inc()
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            metrics.CHUNK_EVENTS.labels(self._server, "dropped").inc()
            return
        if self._queue.qsize() >= self._max_events:
            self._full.set()

    @property
    def ended(self) -> bool:
        """:meth:`end` was called: the call takes no more events."""
        return self._expiry is not None

    def end(self) -> None:
        """End the stream now, without waiting: the sender sends what is buffered, ends the call
        and waits for its answer, cancelled (the call with it, its end reported as a timeout)
        ``deadline_seconds`` from now; events added later are dropped (counted). Idempotent."""
        if self._expiry is None and not self._task.done():
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(_END)
            self._full.set()
            self._expiry = asyncio.get_running_loop().call_later(self._deadline, self._task.cancel)

    def close(self) -> Coroutine[Any, Any, None]:
        """:meth:`end`, and return the wait for the call's end. The end is queued when this is
        called, not when the wait starts, so a task running the wait that is cancelled before
        it starts leaves nothing open. Cancelling the wait once it runs cancels the sender."""
        self.end()
        return self._sent()

    async def _sent(self) -> None:
        """Wait for the sender to end; cancelled, cancel it."""
        try:
            await asyncio.wait({self._task})
        except asyncio.CancelledError:
            self._task.cancel()
            raise

    async def _send(self) -> None:
        call = None
        error: BaseException | None = None
        try:
            call = self._open_call()
            first = True
            ended = False
            while not ended:
                if self._expiry is not None and self._queue.empty():
                    break  # closed, with its end dropped from a full buffer
                item = await self._queue.get()
                if item is _END:
                    break
                batch = [item]
                if self._expiry is None and self._queue.qsize() < self._max_events - 1:
                    # Wait for a full batch, or the batch's time window, whichever comes first
                    # (not once closed: the end is queued, nothing more comes).
                    await set_within(self._full, self._max_delay)
                self._full.clear()
                while len(batch) < self._max_events and not self._queue.empty():
                    item = self._queue.get_nowait()
                    if item is _END:
                        ended = True
                        break
                    batch.append(item)
                request = hooks_pb2.OnChunksRequest(events=batch)
                if first:
                    request.turn.CopyFrom(self._info)
                    first = False
                await call.write(request)
                self.sent_batches += 1
                self.sent_events += len(batch)
                metrics.CHUNK_BATCHES.labels(self._server).inc()
                metrics.CHUNK_EVENTS.labels(self._server, "sent").inc(len(batch))
            await call.done_writing()
            await call
        except asyncio.CancelledError:
            if call is not None:
                call.cancel()
            self._failed = True
            self._on_result(TimeoutError(f"OnChunks did not finish within {self._deadline:g} s"))
            raise
        except Exception as failure:
            error = failure
            self._failed = True
            if call is not None:
                call.cancel()
        finally:
            if self._expiry is not None:
                self._expiry.cancel()
        self._on_result(error)
