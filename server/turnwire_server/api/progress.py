"""Progress keepalives on silent turn streams (docs/semantics.md §8, liveness).

A proxy or client with an idle timeout closes a call that carries nothing for a while, and a
turn can be silent for long: a slow tool, a model thinking, a turn queued behind another. A
stream silent for ``interval`` seconds sends a ``Progress`` event, and another after each further
interval of silence. It is a transport keepalive of this call, not part of the turn's stream:
sequence number 0, never stored, so ResumeTurn's ``after_sequence_number`` only ever counts turn
events. A live turn's stream gets them from a :class:`Heartbeat` (one timer, nothing per event but
a clock read); a re-attached one (ResumeTurn, WatchSubmission), which may wait on the store, from
:func:`keepalive`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable
from typing import Any, Generic, TypeVar

from turnwire_client.v1 import event_pb2
from turnwire_server.engine.channel import EventChannel

R = TypeVar("R")

_TOOL_DONE = frozenset(
    ("tool_output_error", "tool_output_denied", "tool_approval_request", "tool_input_error")
)
"""Events after which a tool call runs no more (a final ``tool_output_available`` also ends it)."""


class Silence:
    """What a stream's next ``Progress`` says: the turn's ids and phase, from the events seen.

    ``started`` is true for a stream that joins after the TurnStart (a ResumeTurn from a
    sequence number above 0). An empty ``conversation_id`` (a ResumeTurn knows only the request
    id) is filled from the first event seen.
    """

    __slots__ = ("_ended", "_running_tools", "_started", "conversation_id", "request_id")

    def __init__(self, conversation_id: str, request_id: str, *, started: bool = False) -> None:
        self.conversation_id = conversation_id
        self.request_id = request_id
        self._started = started
        self._ended = False
        self._running_tools: set[str] = set()

    @property
    def ended(self) -> bool:
        """True once the TurnEnd went by: nothing may follow it."""
        return self._ended

    def saw(self, event: event_pb2.TurnEvent) -> None:
        """Track ``event``, one the stream sends."""
        kind = event.WhichOneof("event")
        if kind in ("text_delta", "reasoning_delta"):
            return  # the bulk of a stream: changes nothing
        if not self.conversation_id:
            self.conversation_id = event.conversation_id
        if kind == "tool_input_available":
            self._running_tools.add(event.tool_input_available.tool_call_id)
        elif kind == "tool_output_available":
            if not event.tool_output_available.preliminary:
                self._running_tools.discard(event.tool_output_available.tool_call_id)
        elif kind in _TOOL_DONE:
            self._running_tools.discard(getattr(event, kind).tool_call_id)
        elif kind in ("turn_start", "attempt_start", "step_start", "step_finish"):
            # A client tool's call never gets a result in its turn: a new step forgets it.
            self._started = True
            self._running_tools.clear()
        elif kind == "turn_end":
            self._ended = True

    def progress(self, silent_seconds: float) -> event_pb2.TurnEvent:
        """The ``Progress`` event for a stream silent for ``silent_seconds``."""
        event = event_pb2.TurnEvent(conversation_id=self.conversation_id, request_id=self.request_id)
        if self._running_tools:
            event.progress.phase = event_pb2.PROGRESS_PHASE_TOOL
        elif self._started:
            event.progress.phase = event_pb2.PROGRESS_PHASE_MODEL
        else:
            event.progress.phase = event_pb2.PROGRESS_PHASE_QUEUED
        event.progress.elapsed.FromNanoseconds(int(silent_seconds * 1e9))
        return event


class Heartbeat(Generic[R]):
    """Progress keepalives for a live turn's stream: a timer puts a ``Progress`` response into the
    turn's ``channel`` (the same queue as the turn's events, so it keeps their order) once the
    stream took nothing from it for ``interval`` seconds (> 0), and again after each further
    interval. ``wrap`` makes the RPC's response of an event.

    The stream calls :meth:`took` for each turn event it takes and :meth:`fresh` for each
    ``Progress``; :meth:`stop` when it ends. At most one ``Progress`` waits in the channel at a
    time; one queued behind turn events (a client too slow to read) is dropped, as is one after
    the TurnEnd.
    """

    __slots__ = ("_channel", "_interval", "_last", "_loop", "_put_at", "_timer", "_wrap", "silence")

    def __init__(
        self,
        channel: EventChannel[R],
        interval: float,
        silence: Silence,
        wrap: Callable[[event_pb2.TurnEvent], R],
    ) -> None:
        self._channel = channel
        self._interval = interval
        self.silence = silence
        self._wrap = wrap
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._put_at: float | None = None
        self._timer = self._loop.call_at(self._last + interval, self._beat)

    def took(self, event: event_pb2.TurnEvent) -> None:
        """The stream took turn event ``event`` (to send it)."""
        self._last = self._loop.time()
        self.silence.saw(event)

    def fresh(self) -> bool:
        """The stream took a ``Progress``: True when it is still true (nothing was taken since it
        was queued, no TurnEnd), so it is sent; False: drop it."""
        put_at, self._put_at = self._put_at, None
        return put_at is not None and self._last <= put_at and not self.silence.ended

    def stop(self) -> None:
        """No more keepalives (the stream ended)."""
        self._timer.cancel()

    def _beat(self) -> None:
        now = self._loop.time()
        due = self._last + self._interval
        if now < due:
            self._timer = self._loop.call_at(due, self._beat)
            return
        if self._put_at is None and not self.silence.ended:
            self._put_at = now
            self._channel.put(self._wrap(self.silence.progress(now - self._last)))
        self._timer = self._loop.call_at(now + self._interval, self._beat)


async def keepalive(
    items: AsyncIterable[R],
    interval: float,
    silence: Silence,
    events_of: Callable[[R], Iterable[event_pb2.TurnEvent]],
    wrap: Callable[[event_pb2.TurnEvent], R],
) -> AsyncGenerator[R, None]:
    """Yield ``items``; while the next one takes more than ``interval`` seconds (> 0) yield
    ``wrap(progress)`` after each interval of silence. ``events_of`` gives an item's TurnEvents.

    One waiting task per stream at a time, for the next item, and one timer: no polling.
    Nothing is sent after the TurnEnd. The source's errors propagate as they are. Leaving
    (the call ends, is cancelled or the caller stops reading) cancels the wait for the next item
    and lets the source finish (a turn stream then releases its turn) before returning.
    """
    source = aiter(items)
    loop = asyncio.get_running_loop()
    since = loop.time()
    waiting: asyncio.Future[Any] = asyncio.ensure_future(anext(source))
    try:
        while True:
            if not silence.ended:
                done, _ = await asyncio.wait((waiting,), timeout=interval)
                if not done:
                    yield wrap(silence.progress(loop.time() - since))
                    continue
            try:
                item = await waiting
            except StopAsyncIteration:
                return
            for event in events_of(item):
                silence.saw(event)
            yield item
            since = loop.time()
            waiting = asyncio.ensure_future(anext(source))
    finally:
        if not waiting.done():
            waiting.cancel()
            await asyncio.wait((waiting,))
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
