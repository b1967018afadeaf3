"""A remote ``on_chunk`` on the turn's ``HookSession``: its batches as calls of the stream.

docs/semantics.md §4 (remote middleware, "Chunks"): a server that sets ``hook_session_chunks``
gets a turn's ``OnChunksRequest`` batches as ``HookCall.on_chunks`` calls, in order with the
turn's other calls, instead of an ``OnChunks`` call of their own: no second stream per turn, and
the turn's end is one write (the last batch, ``last``, with ``OnStepFinish`` and
``OnChatResponse``). The batching is the ``OnChunks`` call's (:mod:`.chunks`): a batch per
``max_events`` events or ``max_delay_ms`` after its first event, and the events buffered are sent
before any later call of the turn, so the server sees them before the hooks that follow them.
The server answers a batch when it has queued it for its handler and the last one when the
handler has returned (hooks.proto, ``OnChunksRequest.last``); at most ``buffer_events`` events
are sent and not yet answered, past it events are dropped and counted, so a slow server never
slows a turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.remote_hooks import metrics
from turnwire_server.remote_hooks.session import HookSession, SessionBroken, posted_due

RPC = "OnChunks"
"""The session's name for the calls (``session.FIELDS``)."""


class SessionChunks:
    """One turn's ``on_chunk`` events as batches on ``session`` (the same interface as
    :class:`~.chunks.ChunkStream`: :meth:`add`, :meth:`end`, :attr:`ended`, :meth:`close`).

    ``info`` goes in the first batch; ``trace_context()`` is each call's W3C context;
    ``on_result(error)`` gets each batch's own outcome (None: answered; not called for a batch the
    server never took, behind another call's deadline or on a stale kept stream) so the caller
    counts it and feeds its breaker. Nothing here waits: the turn's ``on_chat_response`` and the
    session's end wait for the answers, in order with the turn's other calls."""

    def __init__(
        self,
        session: HookSession,
        info: hooks_pb2.TurnInfo,
        *,
        server: str,
        max_events: int,
        max_delay_ms: float,
        buffer_events: int,
        deadline_seconds: float,
        trace_context: Callable[[], Mapping[str, str]],
        on_result: Callable[[BaseException | None], None],
    ) -> None:
        self._session = session
        self._turn = info.request_id
        self._info: hooks_pb2.TurnInfo | None = info  # None once sent
        self._server = server
        self._max_events = max_events
        self._max_delay = max_delay_ms / 1000.0
        self._buffer_events = buffer_events
        self._deadline = deadline_seconds
        self._trace_context = trace_context
        self._on_result = on_result
        self._events: list[event_pb2.TurnEvent] = []
        self._step = -1
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight = 0  # events sent whose batch is not answered yet
        self.ended = False
        """The last batch was sent (or the stream failed): later events are dropped, counted."""

    @property
    def buffered(self) -> bool:
        """Events wait to be sent (the caller sends them before the turn's next call)."""
        return bool(self._events)

    def add(self, step_number: int, event: event_pb2.TurnEvent) -> None:
        """Buffer ``event`` (a ``step_start`` first when ``step_number`` is new); a full batch is
        sent now, else the batch's first event arms its ``max_delay_ms`` timer."""
        if self.ended:
            metrics.CHUNK_EVENTS.labels(self._server, "dropped").inc()
            return
        if step_number != self._step:
            self._step = step_number
            start = event_pb2.TurnEvent()
            start.step_start.step_number = step_number
            self._events.append(start)
        self._events.append(event)
        if len(self._events) >= self._max_events:
            self.flush(now=True)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._max_delay, self.flush, True)

    def flush(self, now: bool = False, *, last: bool = False) -> None:
        """Send the buffered events as a batch (``last``: the turn's last, sent even when empty):
        written at once (``now``) or with the turn's next call. Events past ``buffer_events``
        unanswered are dropped (counted)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._session.request_id != self._turn:  # the stream carries a later turn now
            self._fail(0)
            return
        events, self._events = self._events, []
        if self.ended or (not events and not last):
            return
        if self._in_flight + len(events) > self._buffer_events:
            metrics.CHUNK_EVENTS.labels(self._server, "dropped").inc(len(events))
            events = []
            if not last:
                return
        request = hooks_pb2.OnChunksRequest(events=events, last=last)
        if self._info is not None:
            request.turn.CopyFrom(self._info)
            self._info = None
        try:
            call_id, future = self._session.post(RPC, request, self._trace_context(), now=now)
        except SessionBroken:
            self._fail(len(events))
            return
        self._in_flight += len(events)
        timer = self._session.expire_after(call_id, future, posted_due(self._deadline, self._deadline))
        future.add_done_callback(lambda done: self._answered(done, call_id, len(events), timer))
        metrics.CHUNK_BATCHES.labels(self._server).inc()
        metrics.CHUNK_EVENTS.labels(self._server, "sent").inc(len(events))

    def _answered(
        self, future: asyncio.Future[Any], call_id: int, events: int, timer: asyncio.TimerHandle
    ) -> None:
        timer.cancel()
        self._in_flight -= events
        if future.cancelled():
            return
        error = future.exception()
        if isinstance(error, SessionBroken):
            self._fail(0)  # the turn's later events go on an OnChunks call (the caller's)
            if error.stale or (error.call_id is not None and error.call_id != call_id):
                # Queued behind a call whose deadline passed, or on a kept stream that had gone
                # stale: the server never took it (a hook call would be made again as a unary
                # RPC; a batch has none), so it is not this batch's failure.
                return
        self._on_result(error)  # None, or the server's error answer: the next batches go on

    def _fail(self, events: int) -> None:
        events += len(self._events)
        self._events = []
        if events:
            metrics.CHUNK_EVENTS.labels(self._server, "dropped").inc(events)
        self.ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def end(self) -> None:
        """Send the last batch with the turn's next call (the server's handler sees its input
        end after it); later events are dropped. Idempotent."""
        if not self.ended:
            self.flush(last=True)
            self.ended = True

    def close(self) -> Coroutine[Any, Any, None]:
        """:meth:`end`; the wait returned is for nothing (the session's answers, in order, are
        what the turn's end waits for)."""
        self.end()
        return _nothing()


async def _nothing() -> None:
    return None
